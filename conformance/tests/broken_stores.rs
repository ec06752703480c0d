//! A suite that cannot fail proves nothing: deliberately broken stores (`broken/mod.rs`, one per
//! class of defect), each shown to fail the cases meant to catch it through `run_matching` and
//! `run_all` (and to pass a basic case, so the failure is the defect's). `broken_macro.rs` shows
//! the same through `conformance_tests!`.

mod broken;

use broken::{BASIC_CASE, Defect, caught_by};
use idem_conformance::{Report, run_all, run_matching};

fn check(defect: Defect) -> Report {
    let must_fail = caught_by(defect);
    let report = run_matching(broken::factory(defect), |name| {
        must_fail.contains(&name) || name == BASIC_CASE
    });
    for case in must_fail {
        assert!(
            report.failed(case),
            "{defect:?}: case {case} should fail but passed\n{report}"
        );
    }
    assert!(
        !report.failed(BASIC_CASE),
        "{defect:?} is otherwise a working store\n{report}"
    );
    report
}

#[test]
fn read_then_write_claim_fails_the_concurrency_cases() {
    check(Defect::ReadThenWriteClaim);
}

#[test]
fn read_then_write_rewrite_fails_the_rewrite_races() {
    check(Defect::ReadThenWriteRewrite);
}

#[test]
fn a_rewrite_that_writes_stale_checkpoints_fails_the_checkpoint_races() {
    check(Defect::RewriteWritesStaleCheckpoints);
}

#[test]
fn a_rewrite_that_compares_only_the_token_fails_the_holder_races() {
    check(Defect::RewriteComparesTokenOnly);
}

#[test]
fn missing_fencing_fails_the_fencing_cases() {
    check(Defect::NoFencing);
}

#[test]
fn lease_ending_the_holder_fails_the_late_holder_cases() {
    check(Defect::LeaseEndsHolder);
}

#[test]
fn ignored_expiry_fails_the_expiry_cases() {
    check(Defect::ExpiryIgnored);
}

#[test]
fn case_insensitive_addressing_fails_the_case_case() {
    check(Defect::CaseInsensitiveAddress);
}

#[test]
fn addressing_without_spaces_fails_the_derived_keys_case() {
    check(Defect::SpacesDroppedAddress);
}

#[test]
fn concatenated_addressing_fails_the_separator_case() {
    check(Defect::ConcatenatedAddress);
}

#[test]
fn purge_miscount_fails_the_exact_purge_case() {
    check(Defect::PurgeMiscount);
}

#[test]
fn an_extend_that_sets_the_lease_fails_the_extend_cases() {
    check(Defect::ExtendSetsTheLease);
}

#[test]
fn an_extend_that_writes_nothing_fails_the_heartbeat_case() {
    check(Defect::ExtendForgets);
}

#[test]
fn an_unfenced_checkpoint_fails_the_checkpoint_fencing_cases() {
    check(Defect::CheckpointUnfenced);
}

#[test]
fn a_wait_that_never_wakes_fails_the_wake_cases() {
    check(Defect::NeverWakes);
}

/// `run_all` reports the same failures as `run_matching`, for every defect, and the whole suite
/// never passes a broken store.
#[test]
fn run_all_fails_every_broken_store() {
    for &defect in broken::ALL {
        let report = run_all(broken::factory(defect));
        for case in caught_by(defect) {
            assert!(
                report.failed(case),
                "{defect:?}: run_all: case {case} should fail but passed\n{report}"
            );
        }
        assert!(!report.failed(BASIC_CASE), "{defect:?}\n{report}");
        assert_eq!(
            report.passed.len() + report.failed.len(),
            idem_conformance::cases().len(),
            "run_all runs every case"
        );
    }
}
