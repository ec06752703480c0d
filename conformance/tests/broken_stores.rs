//! A suite that cannot fail proves nothing: deliberately broken stores (`broken/mod.rs`, one per
//! class of defect), each shown to fail the cases meant to catch it through `run_matching` (and
//! to pass a basic case, so the failure is the defect's).

mod broken;

use broken::Defect;
use idem_conformance::{Report, run_matching};

fn check(defect: Defect, must_fail: &[&str]) -> Report {
    let names: Vec<String> = must_fail.iter().map(|s| s.to_string()).collect();
    let report = run_matching(broken::factory(defect), |name| {
        names.iter().any(|n| n == name) || name == "claim_absent_key_is_claimed_as_attempt_one"
    });
    for case in must_fail {
        assert!(
            report.failed(case),
            "{defect:?}: case {case} should fail but passed\n{report}"
        );
    }
    assert!(
        !report.failed("claim_absent_key_is_claimed_as_attempt_one"),
        "{defect:?} is otherwise a working store\n{report}"
    );
    report
}

#[test]
fn read_then_write_claim_fails_the_concurrency_cases() {
    check(
        Defect::ReadThenWriteClaim,
        &[
            "concurrency_64_claims_one_key_one_winner",
            "concurrency_200_keys_one_winner_each",
            "concurrency_executor_runs_once",
        ],
    );
}

#[test]
fn missing_fencing_fails_the_fencing_cases() {
    check(
        Defect::NoFencing,
        &[
            "fencing_second_complete_is_fenced",
            "fencing_stale_token_cannot_complete_after_takeover",
            "fencing_stale_token_cannot_release",
            "fencing_stale_token_cannot_extend",
            "expiry_tokens_never_reused_after_purge",
            "executor_fenced_holder_cannot_overwrite",
        ],
    );
}

#[test]
fn ignored_expiry_fails_the_expiry_cases() {
    check(
        Defect::ExpiryIgnored,
        &[
            "expiry_expired_record_is_absent_to_get",
            "expiry_boundary_is_exact",
            "expiry_expired_completed_is_claimed_again",
            "expiry_holder_cannot_act_after_expiry",
            "expiry_purge_deletes_in_batches_and_keeps_live",
            "executor_expired_record_runs_once_more",
        ],
    );
}
