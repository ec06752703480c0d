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
    let cases = idem_conformance::cases();
    assert_eq!(report.passed.len(), cases.len());
    assert!(report.passed.len() >= 30, "at least 30 cases");
    let names: std::collections::HashSet<_> = cases.iter().map(|c| c.name()).collect();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    assert!(
        cases.iter().all(|c| c.name().starts_with(c.group())
            || (c.group() == "expiry" && c.name().starts_with("inspect_"))),
        "a case's name starts with its group"
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

/// A store without checkpoints (no `CheckpointStore`: `as_checkpoint_store()` keeps its default,
/// `None`) passes the checkpoint cases and is reported as not supporting them.
#[test]
fn a_store_without_checkpoints_is_reported_as_not_supporting_them() {
    let shared = MemoryStore::new();
    let report = idem_conformance::run_matching(
        move || {
            let store = Plain(shared.clone());
            async move { store }
        },
        |name| name.starts_with("checkpoint_"),
    );
    report.assert_all_passed();
    assert!(report.passed.len() >= 7, "{report}");
    let names: Vec<_> = report.not_supported.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, report.passed, "{report}");
    assert!(
        report
            .not_supported
            .iter()
            .all(|(_, f)| *f == "checkpoints"),
        "{report}"
    );
    assert!(report.to_string().contains("does not support checkpoints"));
}

/// A store that keeps no checkpoints: everything forwarded but them.
#[derive(Debug)]
struct Plain(MemoryStore);

#[idem_core::async_trait]
impl idem_core::KeyStore for Plain {
    async fn claim(
        &self,
        id: &idem_core::RecordId,
        fingerprint: &idem_core::Fingerprint,
        policy: &idem_core::Policy,
        now: idem_core::Timestamp,
    ) -> Result<idem_core::machine::ClaimAnswer, idem_core::StoreError> {
        self.0.claim(id, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        id: &idem_core::RecordId,
        token: idem_core::Token,
        outcome: &idem_core::Outcome,
        policy: &idem_core::Policy,
        now: idem_core::Timestamp,
    ) -> Result<idem_core::machine::CompleteAnswer, idem_core::StoreError> {
        self.0.complete(id, token, outcome, policy, now).await
    }
    async fn release(
        &self,
        id: &idem_core::RecordId,
        token: idem_core::Token,
        now: idem_core::Timestamp,
    ) -> Result<idem_core::machine::ReleaseAnswer, idem_core::StoreError> {
        self.0.release(id, token, now).await
    }
    async fn extend(
        &self,
        id: &idem_core::RecordId,
        token: idem_core::Token,
        lease: std::time::Duration,
        now: idem_core::Timestamp,
    ) -> Result<idem_core::machine::ExtendAnswer, idem_core::StoreError> {
        self.0.extend(id, token, lease, now).await
    }
    async fn get(
        &self,
        id: &idem_core::RecordId,
        now: idem_core::Timestamp,
    ) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
        self.0.get(id, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: idem_core::Timestamp,
        limit: usize,
    ) -> Result<Vec<idem_core::Record>, idem_core::StoreError> {
        self.0.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &idem_core::store::ListFilter,
        now: idem_core::Timestamp,
        limit: usize,
    ) -> Result<Vec<idem_core::Record>, idem_core::StoreError> {
        self.0.list(filter, now, limit).await
    }
    async fn purge_expired(
        &self,
        now: idem_core::Timestamp,
        limit: usize,
    ) -> Result<usize, idem_core::StoreError> {
        self.0.purge_expired(now, limit).await
    }
}

/// `run_case` runs one case by the name `cases()` lists (each generated `#[test]` is one call).
#[test]
fn run_case_runs_a_case_by_name() {
    let case = idem_conformance::cases()[0];
    assert_eq!(case.group(), "claim");
    let shared = MemoryStore::new();
    idem_conformance::run_case(case.name(), move || {
        let store = shared.clone();
        async move { store }
    });
}

/// A name that is not a case's is refused, not passed silently.
#[test]
#[should_panic(expected = "no case named")]
fn run_case_refuses_a_name_that_is_no_case() {
    idem_conformance::run_case("claim_that_does_not_exist", || async { MemoryStore::new() });
}
