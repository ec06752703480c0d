//! **The rules the model states itself**, at the level of the SPEC, because `idem_core` does not
//! have them yet: checkpoints (SPEC §6.1) and waiting for an in-flight answer (SPEC §5.2).
//!
//! This is the one place to change when `idem_core::machine` gains them: replace
//! [`checkpoint`] with a call to `machine::checkpoint` (and [`keeps_checkpoints`] with what its
//! claim answer says), and [`wait_until`] / [`wakes`] with the executor's waiting rule. Every
//! other rule the model runs is `idem_core::machine`'s own.

use std::time::Duration;

use idem_core::machine::{ClaimKind, CompleteAnswer};
use idem_core::{Record, RecordState, Timestamp, Token};

/// SPEC §6.1: `checkpoint(scope, key, token, name, value, now)` is fenced like `complete` — only
/// the holder of the current token of a live `processing` record may save one. Whether it is
/// accepted.
pub fn checkpoint(found: Option<&Record>, token: Token, now: Timestamp) -> bool {
    found.is_some_and(|r| {
        !r.is_expired(now) && r.state == RecordState::Processing && r.token == token
    })
}

/// SPEC §6.1: a release, a retryable outcome and a takeover keep the checkpoints (and a retry
/// starts with them); a claim that creates the record (none, expired) starts without.
pub fn keeps_checkpoints(kind: ClaimKind) -> bool {
    matches!(kind, ClaimKind::Retry | ClaimKind::TakenOver)
}

/// SPEC §6.1: completion ends the checkpoints; a retryable outcome keeps them.
pub fn checkpoints_survive(answer: CompleteAnswer) -> bool {
    answer == CompleteAnswer::MarkedRetryable
}

/// SPEC §5.2: a repeat that finds the operation in flight (lease running) waits at most the
/// least of its wait, the tool's maximum and the holder's remaining lease.
pub fn wait_until(record: &Record, now: Timestamp, max_wait: Duration) -> Timestamp {
    record.lease_until.min(now + max_wait)
}

/// SPEC §5.2: a waiter re-reads when the record changed (another state or another claim, or it
/// is gone) or its wait is over; it then claims like any retry.
pub fn wakes(
    seen: Option<(RecordState, Token)>,
    current: Option<&Record>,
    until: Timestamp,
    now: Timestamp,
) -> bool {
    let current = current
        .filter(|r| !r.is_expired(now))
        .map(|r| (r.state, r.token));
    current != seen || now >= until
}
