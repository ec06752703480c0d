//! The transition rules of [contract §2](crate::contract#states): the one place they live.
//!
//! Each function looks at the record a store found for (scope, key) — `None` when there is none —
//! and returns the answer for the caller and, where the rules say so, the record to write. The
//! functions are pure: stores that can run them inside one atomic step (a mutex, a `BEGIN
//! IMMEDIATE` transaction, a `SELECT … FOR UPDATE`) call them; stores that decide in their own
//! engine (a Lua script) must agree with them, which the conformance suite checks.
//!
//! An expired record (`now >= expires_at`) is treated exactly as if it did not exist.
//!
//! ## `claim(scope, key, fingerprint, now)`
//!
//! | record found | same fingerprint | answer | write |
//! | --- | --- | --- | --- |
//! | none, or expired | — | `Claimed { kind: New \| ExpiredReplaced, attempt: 1 }` | insert `processing`; an expired record is replaced and its token `seq` continues upward |
//! | any state | no | `FingerprintMismatch` | nothing |
//! | `processing`, lease running | yes | `InFlight { retry_after: lease_until - now, stale: false }` | nothing |
//! | `processing`, lease elapsed | yes | [`StalePolicy::Reconcile`]: `InFlight { retry_after: lease, stale: true }`; [`StalePolicy::Takeover`]: `Claimed { kind: TakenOver, seq + 1, attempt + 1 }` | only on takeover |
//! | `completed` | yes | `Replay(outcome)` | nothing |
//! | `failed_retryable` | yes | `Claimed { kind: Retry, seq + 1, attempt + 1 }` | back to `processing` |
//!
//! Every claim that writes sets `lease_until = now + lease`, `expires_at = now + ttl`, clears the
//! outcome and draws a fresh random token id. A retry or a takeover keeps the record's
//! checkpoints (the operation resumes from them); a new or replaced record has none.
//!
//! ## `complete`, `release`, `extend`, `checkpoint`
//!
//! Each acts only on a live `processing` record holding exactly the caller's token; anything else
//! (no record, expired, another state, another token) is `Fenced` and writes nothing.
//!
//! | call | write |
//! | --- | --- |
//! | `complete`, definitive outcome | `completed` with the outcome, `expires_at = now + ttl`, checkpoints dropped |
//! | `complete`, retryable outcome, [`CachePolicy::DefinitiveOnly`] | `failed_retryable` with the outcome, `expires_at = now + ttl` |
//! | `complete`, retryable outcome, [`CachePolicy::CacheAll`] | `completed` with the outcome, `expires_at = now + ttl`, checkpoints dropped |
//! | `release` | `failed_retryable`, no outcome |
//! | `checkpoint` | the checkpoint appended to the record's checkpoints ([`checkpoint`]) |
//! | `extend(lease)` | `lease_until = max(lease_until, now + lease)`: a lease is never shortened, the later deadline wins; `expires_at` moves so it stays at least as far past the lease as it was |
//!
//! An outcome larger than [`Policy::max_outcome_bytes`] is refused before any of this, whatever
//! the record: [`OutcomeTooLarge`]. A lease of zero whole milliseconds (leases are stored in
//! milliseconds) is refused by `extend` the same way, before looking at the record:
//! [`ZeroLease`].
//!
//! The executor never leaves a record `processing` because its outcome was too large: it completes
//! it with [`Outcome::not_kept`] instead ([contract §2](crate::contract#states)), through the same
//! `complete`.

use std::time::Duration;

mod checkpoint;

pub use crate::store::error::{CheckpointTooLarge, OutcomeTooLarge, ZeroLease};
pub use checkpoint::{CheckpointAnswer, check_checkpoint_size, checkpoint};

use crate::{
    CachePolicy, Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Policy, Record, RecordId,
    RecordState, Scope, StalePolicy, Timestamp, Token,
};

/// How a claim was won.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimKind {
    /// There was no record.
    New,
    /// There was an expired record, which was replaced.
    ExpiredReplaced,
    /// The record was `failed_retryable`.
    Retry,
    /// The record was `processing` with an elapsed lease, and the policy is
    /// [`StalePolicy::Takeover`].
    TakenOver,
}

/// The answer to a claim ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// The caller holds the claim and must now run the operation, then complete or release.
    Claimed {
        /// The fencing token of this claim.
        token: Token,
        /// Which attempt this is, from 1.
        attempt: u32,
        /// How the claim was won.
        kind: ClaimKind,
    },
    /// The operation already completed; this is its stored outcome.
    Replay(Outcome),
    /// Another holder is processing the operation.
    InFlight {
        /// Under a running lease, the holder's remaining lease; for a stale record, the
        /// policy's lease (never zero). The executor tells its caller its own retry hint,
        /// from the tool's processing window ([contract §4](crate::contract#refusals)).
        retry_after: Duration,
        /// The holder's lease has elapsed and the record waits for reconciliation.
        stale: bool,
    },
    /// The key was first used with another request.
    FingerprintMismatch,
}

/// The answer to `complete` ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompleteAnswer {
    /// The record is `completed` with the outcome.
    Completed,
    /// The outcome was retryable and the record is now `failed_retryable`.
    MarkedRetryable,
    /// The caller does not hold the current claim; nothing was written.
    Fenced,
}

/// The answer to `release` ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseAnswer {
    /// The record is now `failed_retryable`.
    Released,
    /// The caller does not hold the current claim; nothing was written.
    Fenced,
}

/// The answer to `extend` ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtendAnswer {
    /// The lease now runs until this instant: the later of the deadline it had and
    /// `now + lease`.
    Extended {
        /// The lease deadline now stored.
        lease_until: Timestamp,
    },
    /// The caller does not hold the current claim; nothing was written.
    Fenced,
}

/// Refuses a lease that is zero in whole milliseconds, the unit stores keep it in.
pub fn check_lease(lease: Duration) -> Result<(), ZeroLease> {
    if lease.as_millis() == 0 {
        return Err(ZeroLease { lease });
    }
    Ok(())
}

/// The result of a rule: what to answer, and the record to write (if anything changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition<A> {
    /// The answer for the caller.
    pub answer: A,
    /// The record to store in place of the one found, or `None` to write nothing.
    pub write: Option<Record>,
}

impl<A> Transition<A> {
    fn answer(answer: A) -> Self {
        Self {
            answer,
            write: None,
        }
    }
}

/// What a claim names: the record's address and the request's fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The scope.
    pub scope: &'a Scope,
    /// The key.
    pub key: &'a IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// A fresh random id for the token, used only if the claim is won
    /// (stores pass `rand::random()`; tests pass what they like).
    pub token_id: u128,
}

impl<'a> ClaimRequest<'a> {
    /// A request for the record `id` with a fresh random token id.
    pub fn new(id: &'a RecordId, fingerprint: &'a Fingerprint) -> Self {
        Self {
            scope: id.scope(),
            key: id.key(),
            fingerprint,
            token_id: rand::random(),
        }
    }
}

/// The claim rule. `found` is the record stored for (scope, key), expired or not.
pub fn claim(
    found: Option<&Record>,
    req: ClaimRequest<'_>,
    now: Timestamp,
    policy: &Policy,
) -> Transition<ClaimAnswer> {
    let live = found.filter(|r| !r.is_expired(now));
    let Some(record) = live else {
        let (kind, seq) = match found {
            Some(expired) => (ClaimKind::ExpiredReplaced, expired.token.seq + 1),
            None => (ClaimKind::New, 1),
        };
        let token = Token::with_id(seq, req.token_id);
        let record = Record {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fingerprint: req.fingerprint.clone(),
            state: RecordState::Processing,
            token,
            attempt: 1,
            lease_until: now + policy.lease(),
            outcome: None,
            created_at: now,
            updated_at: now,
            expires_at: now + policy.ttl(),
            checkpoints: Vec::new(),
        };
        return Transition {
            answer: ClaimAnswer::Claimed {
                token,
                attempt: 1,
                kind,
            },
            write: Some(record),
        };
    };

    if &record.fingerprint != req.fingerprint {
        return Transition::answer(ClaimAnswer::FingerprintMismatch);
    }

    match record.state {
        RecordState::Completed => {
            // A completed record always carries its outcome; a store that lost it is corrupt,
            // and the safest answer is "someone is on it", never "run it again".
            match &record.outcome {
                Some(outcome) => Transition::answer(ClaimAnswer::Replay(outcome.clone())),
                None => Transition::answer(ClaimAnswer::InFlight {
                    retry_after: policy.lease(),
                    stale: true,
                }),
            }
        }
        RecordState::Processing if !record.lease_elapsed(now) => {
            Transition::answer(ClaimAnswer::InFlight {
                retry_after: record
                    .lease_until
                    .saturating_since(now)
                    .max(Duration::from_millis(1)),
                stale: false,
            })
        }
        RecordState::Processing => match policy.stale() {
            StalePolicy::Reconcile => Transition::answer(ClaimAnswer::InFlight {
                retry_after: policy.lease(),
                stale: true,
            }),
            StalePolicy::Takeover => {
                reclaim(record, ClaimKind::TakenOver, req.token_id, now, policy)
            }
        },
        RecordState::FailedRetryable => {
            reclaim(record, ClaimKind::Retry, req.token_id, now, policy)
        }
    }
}

fn reclaim(
    record: &Record,
    kind: ClaimKind,
    token_id: u128,
    now: Timestamp,
    policy: &Policy,
) -> Transition<ClaimAnswer> {
    let token = Token::with_id(record.token.seq + 1, token_id);
    let attempt = record.attempt.saturating_add(1);
    let write = Record {
        state: RecordState::Processing,
        token,
        attempt,
        lease_until: now + policy.lease(),
        outcome: None,
        updated_at: now,
        expires_at: now + policy.ttl(),
        ..record.clone()
    };
    Transition {
        answer: ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
        },
        write: Some(write),
    }
}

/// The record `found` if the holder of `token` may act on it at `now`.
fn held(found: Option<&Record>, token: Token, now: Timestamp) -> Option<&Record> {
    found.filter(|r| !r.is_expired(now) && r.state == RecordState::Processing && r.token == token)
}

/// Checks an outcome against the policy's size limit.
pub fn check_outcome_size(outcome: &Outcome, policy: &Policy) -> Result<(), OutcomeTooLarge> {
    if outcome.size() > policy.max_outcome_bytes() {
        return Err(OutcomeTooLarge {
            size: outcome.size(),
            limit: policy.max_outcome_bytes(),
        });
    }
    Ok(())
}

/// The state an outcome leads to under a cache policy.
pub fn completed_state(outcome: &Outcome, policy: &Policy) -> RecordState {
    match (outcome.class(), policy.cache()) {
        (OutcomeClass::Definitive, _) | (OutcomeClass::Retryable, CachePolicy::CacheAll) => {
            RecordState::Completed
        }
        (OutcomeClass::Retryable, CachePolicy::DefinitiveOnly) => RecordState::FailedRetryable,
    }
}

/// The complete rule.
pub fn complete(
    found: Option<&Record>,
    token: Token,
    outcome: &Outcome,
    now: Timestamp,
    policy: &Policy,
) -> Result<Transition<CompleteAnswer>, OutcomeTooLarge> {
    check_outcome_size(outcome, policy)?;
    let Some(record) = held(found, token, now) else {
        return Ok(Transition::answer(CompleteAnswer::Fenced));
    };
    let state = completed_state(outcome, policy);
    let answer = match state {
        RecordState::Completed => CompleteAnswer::Completed,
        _ => CompleteAnswer::MarkedRetryable,
    };
    // A completed operation's checkpoints end with it; a retryable outcome keeps them for the
    // next attempt.
    let checkpoints = match state {
        RecordState::Completed => Vec::new(),
        _ => record.checkpoints.clone(),
    };
    Ok(Transition {
        answer,
        write: Some(Record {
            state,
            outcome: Some(outcome.clone()),
            updated_at: now,
            expires_at: now + policy.ttl(),
            checkpoints,
            ..record.clone()
        }),
    })
}

/// The release rule.
pub fn release(found: Option<&Record>, token: Token, now: Timestamp) -> Transition<ReleaseAnswer> {
    let Some(record) = held(found, token, now) else {
        return Transition::answer(ReleaseAnswer::Fenced);
    };
    Transition {
        answer: ReleaseAnswer::Released,
        write: Some(Record {
            state: RecordState::FailedRetryable,
            outcome: None,
            updated_at: now,
            ..record.clone()
        }),
    }
}

/// The new `expires_at` when a lease moves to `lease_until`: at least as far past the new lease
/// as it was past the old one.
pub fn extended_expiry(record: &Record, lease_until: Timestamp) -> Timestamp {
    let margin = record.expires_at.saturating_since(record.lease_until);
    record.expires_at.max(lease_until + margin)
}

/// The extend rule: refuses a zero lease ([`check_lease`]) whatever the record; then, for the
/// holder, moves the lease to the later of its current deadline and `now + lease` (it never
/// shortens it) and answers that deadline.
pub fn extend(
    found: Option<&Record>,
    token: Token,
    lease: Duration,
    now: Timestamp,
) -> Result<Transition<ExtendAnswer>, ZeroLease> {
    check_lease(lease)?;
    let Some(record) = held(found, token, now) else {
        return Ok(Transition::answer(ExtendAnswer::Fenced));
    };
    let lease_until = record.lease_until.max(now + lease);
    Ok(Transition {
        answer: ExtendAnswer::Extended { lease_until },
        write: Some(Record {
            lease_until,
            expires_at: extended_expiry(record, lease_until),
            updated_at: now,
            ..record.clone()
        }),
    })
}

#[cfg(test)]
mod tests;
