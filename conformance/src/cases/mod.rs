//! The cases, by group. Each is an `async fn(Harness)` that panics on failure.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::panic::Location;

use idem_core::machine::ClaimAnswer;
use idem_core::{
    ClaimKind, Fingerprint, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Policy, Record,
    RecordId, StalePolicy, Timestamp, Token,
};

use crate::harness::{Case, Harness};

mod checkpoint;
mod claim;
mod concurrency;
mod executor;
mod expiry;
mod fencing;
mod heartbeat;
mod outcome;
mod scope;
mod wait;

/// Every case as `group::case`, handed to `$callback`; the one list both
/// [`crate::conformance_tests!`] (the test names) and [`ALL`] (the cases) are built from.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_list {
    ($callback:ident $args:tt) => {
        $crate::$callback! { $args
            claim::claim_absent_key_is_claimed_as_attempt_one,
            claim::claim_writes_a_processing_record,
            claim::claim_while_lease_runs_is_in_flight,
            claim::claim_in_flight_writes_nothing,
            claim::claim_stale_under_reconcile_is_stale_in_flight,
            claim::claim_stale_under_takeover_claims_next_token,
            claim::claim_completed_replays,
            claim::claim_failed_retryable_claims_again,
            claim::claim_mismatch_on_processing,
            claim::claim_mismatch_on_completed,
            claim::claim_mismatch_on_failed_retryable,
            claim::claim_tokens_are_unique_across_keys,
            fencing::fencing_complete_definitive_completes,
            fencing::fencing_retryable_under_definitive_only_is_failed_retryable,
            fencing::fencing_retryable_under_cache_all_completes,
            fencing::fencing_second_complete_is_fenced,
            fencing::fencing_stale_token_cannot_complete_after_takeover,
            fencing::fencing_stale_token_cannot_release,
            fencing::fencing_stale_token_cannot_extend,
            fencing::fencing_unknown_key_is_fenced,
            fencing::fencing_release_then_retry,
            fencing::fencing_extend_keeps_the_claim_alive,
            fencing::fencing_extend_never_shortens,
            fencing::fencing_extend_refuses_a_zero_lease,
            fencing::fencing_fingerprint_kept_on_completion,
            fencing::fencing_holder_completes_after_its_lease_elapsed,
            fencing::fencing_holder_releases_after_its_lease_elapsed,
            fencing::fencing_holder_extends_after_its_lease_elapsed,
            scope::scope_same_key_two_scopes_two_records,
            scope::scope_no_cross_scope_replay,
            scope::scope_case_is_significant,
            scope::scope_unicode_is_compared_byte_for_byte,
            scope::scope_trailing_spaces_are_significant,
            scope::scope_separator_position_is_significant,
            scope::scope_long_values_differing_in_the_last_byte,
            scope::scope_derived_keys_are_stored_as_they_are,
            outcome::outcome_replays_byte_for_byte,
            outcome::outcome_unicode_and_escapes_survive,
            outcome::outcome_up_to_the_limit_is_stored,
            outcome::outcome_over_the_limit_is_refused_and_nothing_stored,
            expiry::expiry_expired_record_is_absent_to_get,
            expiry::expiry_boundary_is_exact,
            expiry::expiry_expired_completed_is_claimed_again,
            expiry::expiry_holder_cannot_act_after_expiry,
            expiry::expiry_purge_deletes_in_batches_and_keeps_live,
            expiry::expiry_purge_returns_exactly_what_it_deleted,
            expiry::expiry_tokens_never_reused_after_purge,
            expiry::inspect_get_returns_the_record,
            expiry::inspect_list_in_flight_returns_only_stale_processing,
            expiry::inspect_list_filters_by_state_scope_and_age,
            concurrency::concurrency_64_claims_one_key_one_winner,
            concurrency::concurrency_200_keys_one_winner_each,
            concurrency::concurrency_executor_runs_once,
            concurrency::concurrency_claims_race_on_an_expired_record,
            concurrency::concurrency_claims_race_on_a_failed_retryable_record,
            concurrency::concurrency_claims_race_on_a_stale_record_under_takeover,
            concurrency::concurrency_claims_racing_a_completion_never_win,
            concurrency::concurrency_claims_racing_a_release_one_winner,
            concurrency::concurrency_executor_retry_runs_once,
            concurrency::concurrency_takeover_racing_the_holders_completion,
            concurrency::concurrency_takeover_racing_the_holders_release,
            concurrency::concurrency_takeover_racing_the_holders_extension,
            executor::executor_same_key_twice_one_effect,
            executor::executor_mismatch_runs_nothing,
            executor::executor_in_flight_runs_nothing,
            executor::executor_expired_record_runs_once_more,
            executor::executor_retryable_failure_then_one_success,
            executor::executor_fenced_holder_cannot_overwrite,
            executor::executor_slow_holder_past_its_lease_is_recorded,
            heartbeat::heartbeat_keeps_a_holder_twice_its_lease,
            heartbeat::heartbeat_off_the_holder_is_taken_over,
            heartbeat::heartbeat_late_renewal_tells_the_holder_it_lost,
            checkpoint::checkpoint_saved_in_order_byte_for_byte,
            checkpoint::checkpoint_stale_holder_is_fenced_after_takeover,
            checkpoint::checkpoint_fenced_like_complete,
            checkpoint::checkpoint_kept_across_release_and_retryable_outcome,
            checkpoint::checkpoint_gone_after_completion,
            checkpoint::checkpoint_gone_after_expiry_and_purge,
            checkpoint::checkpoint_over_the_limit_is_refused_and_nothing_written,
            checkpoint::checkpoint_kept_by_a_racing_takeover,
            checkpoint::checkpoint_kept_by_a_racing_reconciler_takeover,
            wait::wait_wakes_on_completion,
            wait::wait_wakes_on_release,
            wait::wait_wakes_on_takeover,
            wait::wait_bound_passes_after_a_short_real_wait,
        }
    };
}

/// Every case of the suite.
pub(crate) static ALL: &[Case] = crate::__case_list!(__emit_table());

/// The lease the cases use.
const LEASE: Duration = Duration::from_secs(30);
/// The ttl the cases use.
const TTL: Duration = Duration::from_secs(3600);

/// The cases' default policy: 30 s lease, 1 h ttl, `Reconcile`, `DefinitiveOnly`, 1 MiB.
fn policy() -> Policy {
    Policy::builder()
        .lease(LEASE)
        .ttl(TTL)
        .build()
        .expect("valid policy")
}

/// [`policy`] with [`StalePolicy::Takeover`].
fn takeover() -> Policy {
    policy()
        .to_builder()
        .stale(StalePolicy::Takeover)
        .build()
        .expect("valid policy")
}

/// The fingerprint of the `create_ticket` request titled `title`.
fn fp(title: &str) -> Fingerprint {
    Fingerprint::of(
        "create_ticket",
        &serde_json::json!({"title": title, "account_id": "A-1"}),
    )
    .expect("fingerprint")
}

/// A definitive 201 outcome naming `ticket`.
fn ok(ticket: &str) -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"ticket_id": ticket})).expect("outcome")
}

/// A retryable 503 outcome.
fn retryable() -> Outcome {
    Outcome::new(
        503,
        &serde_json::json!({"error": "upstream timeout"}),
        OutcomeClass::Retryable,
    )
    .expect("outcome")
}

/// `InFlight` on a running lease (not stale) with `retry_after` left.
fn running(retry_after: Duration) -> ClaimAnswer {
    ClaimAnswer::InFlight {
        retry_after,
        stale: false,
    }
}

/// The token and attempt of a `Claimed` answer; panics with `context` otherwise.
#[track_caller]
fn claimed(answer: &ClaimAnswer, context: &str) -> (Token, u32) {
    let (token, attempt, _) = won(answer, context);
    (token, attempt)
}

/// The token, attempt and kind of a `Claimed` answer; panics with `context` otherwise.
#[track_caller]
fn won(answer: &ClaimAnswer, context: &str) -> (Token, u32, ClaimKind) {
    match answer {
        ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
        } => (*token, *attempt, *kind),
        other => panic!("{context}: expected Claimed, got {other:?}"),
    }
}

/// A random instant in the given range of years since 1970 (for cases that must not share their
/// time with any other case).
fn ancient(from_year: u64, to_year: u64) -> Timestamp {
    const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;
    let span = (to_year - from_year) * YEAR_MS;
    Timestamp::from_millis((from_year - 1970) * YEAR_MS + rand::random::<u64>() % span)
}

/// A store handle and the harness's address for one record.
async fn one(h: &Harness) -> (Arc<dyn KeyStore>, RecordId) {
    (h.store().await, h.id("s", "wf-1:step-1:create_ticket"))
}

/// [`one`] record, claimed now with the request `a` under `policy`: the store handle, the
/// address and the holder's token; panics with the answer if the claim does not win.
#[track_caller]
fn one_claimed<'a>(
    h: &'a Harness,
    policy: &'a Policy,
) -> impl Future<Output = (Arc<dyn KeyStore>, RecordId, Token)> + Send + 'a {
    let caller = Location::caller();
    async move {
        let (store, id) = one(h).await;
        let token = claim_absent(caller, &store, &id, &fp("a"), policy, h.now()).await;
        (store, id, token)
    }
}

/// Claims a key that must be absent and returns the token; panics with the answer otherwise.
#[track_caller]
fn claim_new<'a>(
    store: &'a Arc<dyn KeyStore>,
    id: &'a RecordId,
    fingerprint: &'a Fingerprint,
    policy: &'a Policy,
    now: Timestamp,
) -> impl Future<Output = Token> + Send + 'a {
    claim_absent(Location::caller(), store, id, fingerprint, policy, now)
}

/// [`claim_new`], failing with the location of the case that called it.
async fn claim_absent(
    caller: &Location<'_>,
    store: &Arc<dyn KeyStore>,
    id: &RecordId,
    fingerprint: &Fingerprint,
    policy: &Policy,
    now: Timestamp,
) -> Token {
    let answer = store.claim(id, fingerprint, policy, now).await.unwrap();
    match answer {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("{caller}: claim of an absent key: expected Claimed, got {other:?}"),
    }
}

/// The record `id` now, read through a new handle (so what was written is committed, not only
/// visible to its writer); panics if there is none.
async fn read_back(h: &Harness, id: &RecordId) -> Record {
    h.store()
        .await
        .get(id, h.now())
        .await
        .unwrap()
        .expect("a record")
}

/// Asserts that a claim of `id` at `now`, request `a` under the default policy, claims
/// it again as attempt 2 (after a retryable outcome or a release).
async fn assert_claimed_again(store: &Arc<dyn KeyStore>, id: &RecordId, now: Timestamp) {
    let again = store.claim(id, &fp("a"), &policy(), now).await.unwrap();
    assert!(
        matches!(again, ClaimAnswer::Claimed { attempt: 2, .. }),
        "{again:?}"
    );
}

/// Asserts that `token` can neither complete, release nor extend `id` at `now`.
async fn assert_all_fenced(store: &Arc<dyn KeyStore>, id: &RecordId, token: Token, now: Timestamp) {
    use idem_core::machine::{CompleteAnswer, ExtendAnswer, ReleaseAnswer};
    let completed = store
        .complete(id, token, &ok("X"), &policy(), now)
        .await
        .unwrap();
    assert_eq!(completed, CompleteAnswer::Fenced, "complete with {token:?}");
    let released = store.release(id, token, now).await.unwrap();
    assert_eq!(released, ReleaseAnswer::Fenced, "release with {token:?}");
    let extended = store.extend(id, token, LEASE, now).await.unwrap();
    assert_eq!(extended, ExtendAnswer::Fenced, "extend with {token:?}");
}
