//! The metric names of every idem crate, their descriptions and units ([contract
//! §8](crate::contract#observability)).
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade, so any exporter plugs in.
//! Install your recorder, then call [`describe`] once so the exporter knows each metric's help
//! text and unit (`idem serve --metrics` does both). Describing is optional: undescribed metrics
//! are still recorded.
//!
//! Every label value is one of a small fixed set (listed on each name below), never a key, a
//! scope or anything else a caller chooses.

use std::future::Future;
use std::time::Instant;

use ::metrics::Unit;

use crate::store::error::StoreError;

/// Counter of claim answers; labels `result`: `claimed`, `replayed`, `in_flight`, `mismatch`,
/// `taken_over`; and `key_source`, where the key came from ([`KeyOrigin`](crate::KeyOrigin)):
/// `sent`, `arguments`, `model_argument`, `request`.
pub const CLAIMS: &str = "idem_claims_total";
/// Counter of completions; label `result`: `completed`, `retryable`, `fenced`.
pub const COMPLETIONS: &str = "idem_completions_total";
/// Counter of failed store operations; labels `op` (as in [`STORE_OP_SECONDS`]) and `kind`
/// ([`StoreError::kind`]).
pub const STORE_ERRORS: &str = "idem_store_errors_total";
/// Histogram of store operation durations in seconds; labels `backend`
/// ([`KeyStore::backend`](crate::KeyStore::backend)) and `op`: `claim`, `complete`, `release`,
/// `extend`, `get`, `list_in_flight`, `list`, `purge_expired`, `checkpoint` (the
/// [`KeyStore`](crate::KeyStore) methods).
pub const STORE_OP_SECONDS: &str = "idem_store_op_seconds";
/// Counter of requests passed through unprotected (no key where the key is optional); label
/// `transport`: `http`, `mcp`.
pub const UNPROTECTED: &str = "idem_unprotected_total";
/// Counter of requests refused before anything ran; labels `transport` (`http`, `mcp`) and
/// `reason`: `key-required`, `invalid-key`, `invalid-body`, `body-too-large`,
/// `fingerprint-mismatch`, `unauthenticated`, `invalid-scope` (the problem types of
/// [contract §4](crate::contract#refusals)).
pub const REFUSALS: &str = "idem_refusals_total";
/// Counter of the reconciler's decisions, one per examined record; label `decision`:
/// `completed`, `released`, `unknown`, `skipped`, `failed`.
pub const RECONCILE_DECISIONS: &str = "idem_reconcile_decisions_total";
/// Counter of waits for an in-flight answer ([contract §5.2](crate::contract#waiting)); label
/// `result`: `replayed`, `claimed` (the record became claimable and this request won it),
/// `timed_out` (the bound passed: `InFlight`).
pub const WAITS: &str = "idem_waits_total";
/// Histogram of how long waits for an in-flight answer lasted, in seconds.
pub const WAIT_SECONDS: &str = "idem_wait_seconds";

/// Counter of checkpoints operations saved ([contract §6.1](crate::contract#checkpoints)); label
/// `result`: `saved`, `fenced`.
pub const CHECKPOINTS: &str = "idem_checkpoints_total";

/// Describes every idem metric (help text and unit) to the installed recorder. Call it after
/// installing the recorder; calling it again is harmless.
pub fn describe() {
    ::metrics::describe_counter!(
        CLAIMS,
        Unit::Count,
        "Claim answers of the idempotency store, by result"
    );
    ::metrics::describe_counter!(
        COMPLETIONS,
        Unit::Count,
        "Completions of claimed records, by result"
    );
    ::metrics::describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Failed idempotency store operations, by operation and error kind"
    );
    ::metrics::describe_histogram!(
        STORE_OP_SECONDS,
        Unit::Seconds,
        "Duration of idempotency store operations, by backend and operation"
    );
    ::metrics::describe_counter!(
        UNPROTECTED,
        Unit::Count,
        "Requests passed through without an idempotency key where the key is optional"
    );
    ::metrics::describe_counter!(
        REFUSALS,
        Unit::Count,
        "Requests refused before anything ran, by transport and reason"
    );
    ::metrics::describe_counter!(
        RECONCILE_DECISIONS,
        Unit::Count,
        "Decisions of the reconciler on stale records, by decision"
    );
    ::metrics::describe_counter!(
        CHECKPOINTS,
        Unit::Count,
        "Checkpoints operations saved, by result"
    );
    ::metrics::describe_counter!(
        WAITS,
        Unit::Count,
        "Waits of repeated requests for an in-flight answer, by result"
    );
    ::metrics::describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Duration of waits for an in-flight answer"
    );
}

/// Runs one store operation, recording its duration in [`STORE_OP_SECONDS`] and counting a failure
/// in [`STORE_ERRORS`]. `backend` is the store's [`KeyStore::backend`](crate::KeyStore::backend),
/// `op` the trait method's name. The executor and the reconciler time their own store calls; use
/// this for the ones you make yourself (the CLI does).
pub async fn timed<T>(
    backend: &'static str,
    op: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = call.await;
    ::metrics::histogram!(STORE_OP_SECONDS, "backend" => backend, "op" => op)
        .record(started.elapsed().as_secs_f64());
    if let Err(e) = &result {
        ::metrics::counter!(STORE_ERRORS, "op" => op, "kind" => e.kind()).increment(1);
    }
    result
}

/// Counts one refusal in [`REFUSALS`]. For the transports' own use (`idem-http`, `idem-mcp`).
pub(crate) fn count_refusal(transport: &'static str, reason: &'static str) {
    ::metrics::counter!(REFUSALS, "transport" => transport, "reason" => reason).increment(1);
}

/// Counts one request passed through unprotected in [`UNPROTECTED`].
pub fn count_unprotected(transport: &'static str) {
    ::metrics::counter!(UNPROTECTED, "transport" => transport).increment(1);
}

pub(crate) fn count_reconcile(decision: &'static str) {
    ::metrics::counter!(RECONCILE_DECISIONS, "decision" => decision).increment(1);
}

pub(crate) fn count_checkpoint(result: &'static str) {
    ::metrics::counter!(CHECKPOINTS, "result" => result).increment(1);
}

pub(crate) fn count_wait(result: &'static str, waited: std::time::Duration) {
    ::metrics::counter!(WAITS, "result" => result).increment(1);
    ::metrics::histogram!(WAIT_SECONDS).record(waited.as_secs_f64());
}
