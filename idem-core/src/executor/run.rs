//! [`Executor::run`]: claim, run at most once, record, or replay, in the call's span.

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use std::time::Duration;

use super::attempt::{Lease, ReleaseOnDrop};
use super::heartbeat::beside;
use super::observe::{count_claim, count_completion};
use super::{Attempt, Execution, Executor, Reply, Terms};
use crate::codec::{CodecContext, decode_outcome};
use crate::machine::{ClaimAnswer, ClaimKind};
use crate::{
    Error, ErrorAnswer, Fingerprint, IdempotencyKey, Outcome, OutcomeClass, RecordId, Scope,
    Timestamp,
};

impl Executor {
    /// Runs `operation` at most once for (scope, key) and the request `fingerprint`.
    ///
    /// - No live record, or a retryable failure before: claims, runs `operation`, records its
    ///   outcome and returns [`Execution::Executed`].
    /// - Completed before: returns [`Execution::Replayed`] with the stored outcome, without
    ///   running `operation`.
    /// - Otherwise an [`Error`] that says whether the operation ran.
    pub async fn run<F, Fut>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        operation: F,
    ) -> Result<Execution, Error>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Outcome>,
    {
        let span = Self::span(scope, key, fingerprint);
        let (reply, _) = self
            .run_in_span(
                Terms::of(&self.tool, key.origin(), self.wait),
                scope,
                key,
                fingerprint,
                operation,
                |o| ((), Ok(o)),
            )
            .instrument(span)
            .await;
        let reply = reply?;
        match reply {
            Reply::Executed {
                outcome,
                attempt,
                unrecorded: None,
                ..
            } => Ok(Execution::Executed { outcome, attempt }),
            Reply::Replayed { outcome } => Ok(Execution::Replayed { outcome }),
            Reply::Executed {
                unrecorded: Some(error),
                ..
            }
            | Reply::Refused {
                error: Some(error), ..
            } => Err(error),
            Reply::Refused {
                error: None,
                refusal,
            } => Err(refused_without_error(refusal)),
        }
    }

    /// The span of one executor call ([contract §8](crate::contract#observability)).
    pub(crate) fn span(
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> tracing::Span {
        tracing::info_span!(
            "idem.call",
            scope = %scope,
            key = %key,
            fingerprint = fingerprint.short(),
            attempt = tracing::field::Empty,
            token = tracing::field::Empty,
        )
    }

    /// Claims (waiting as the call's `terms` say), runs, records or replays;
    /// `to_answer` turns the operation's output into the value handed back and the outcome to
    /// record. An error before the operation ran is `Err`; once it ran, its value comes back as
    /// [`Reply::Executed`], with the error if its outcome was not recorded as this attempt's.
    /// Beside it: how long the call waited for an in-flight answer, if it did.
    pub(crate) async fn run_in_span<F, Fut, O, V>(
        &self,
        terms: Terms,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        operation: F,
        to_answer: impl FnOnce(O) -> (V, Result<Outcome, Unserializable>),
    ) -> (Result<Reply<V>, Error>, Option<Duration>)
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = O>,
    {
        let id = RecordId::new(scope.clone(), key.clone());
        let ((answer, guard, claimed_at), waited) =
            match self.claim_or_wait(&terms, &id, fingerprint).await {
                Ok(claimed) => claimed,
                Err(error) => return (Err(error), None),
            };
        let reply = self
            .after_claim(&terms, id, answer, guard, claimed_at, operation, to_answer)
            .await;
        (reply, waited)
    }

    /// What follows a claim's `answer`: the replay, the refusal, or the operation run and
    /// recorded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn after_claim<F, Fut, O, V>(
        &self,
        terms: &Terms,
        id: RecordId,
        answer: ClaimAnswer,
        guard: Option<ReleaseOnDrop>,
        claimed_at: Timestamp,
        operation: F,
        to_answer: impl FnOnce(O) -> (V, Result<Outcome, Unserializable>),
    ) -> Result<Reply<V>, Error>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = O>,
    {
        let (scope, key) = (id.scope(), id.key());
        let origin = key.origin().as_str();
        let (token, number, kind) = match answer {
            ClaimAnswer::Claimed {
                token,
                attempt,
                kind,
            } => (token, attempt, kind),
            ClaimAnswer::Replay(stored) => {
                let cx = CodecContext::new(scope, key);
                let outcome = match decode_outcome(self.codec.as_deref(), &cx, stored) {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        tracing::error!(error = %e, "stored outcome could not be decoded; nothing ran, nothing replayed");
                        count_claim("replayed", origin);
                        return Err(Error::Decode(e));
                    }
                };
                transition!(
                    INFO,
                    "replayed",
                    status = outcome.status(),
                    key_source = origin,
                    "replaying stored outcome"
                );
                count_claim("replayed", origin);
                return Ok(Reply::Replayed { outcome });
            }
            ClaimAnswer::InFlight { retry_after, stale } => {
                // Under a running lease: when the answer is likely ready, from the tool's
                // window; a stale record waits for reconciliation, at the lease's pace.
                let retry_after = match stale {
                    false => terms.retry_hint(retry_after),
                    true => retry_after,
                };
                transition!(
                    INFO,
                    "in_flight",
                    retry_after_ms = retry_after.as_millis() as u64,
                    stale,
                    "operation in flight"
                );
                count_claim("in_flight", origin);
                return Err(Error::InFlight { retry_after, stale });
            }
            ClaimAnswer::FingerprintMismatch => {
                transition!(WARN, "mismatch", "key reused with a different request");
                count_claim("mismatch", origin);
                return Err(Error::FingerprintMismatch);
            }
        };
        let span = tracing::Span::current();
        span.record("attempt", number);
        span.record("token", token.short());
        match kind {
            ClaimKind::TakenOver => {
                transition!(
                    WARN,
                    "taken_over",
                    attempt = number,
                    "stale claim taken over"
                );
                count_claim("taken_over", origin);
            }
            ClaimKind::ExpiredReplaced => {
                transition!(INFO, "expired_replaced", "expired record replaced");
                count_claim("claimed", origin);
            }
            ClaimKind::New | ClaimKind::Retry => {
                transition!(
                    INFO,
                    "claimed",
                    attempt = number,
                    ?kind,
                    key_source = origin,
                    "claimed"
                );
                count_claim("claimed", origin);
            }
        }

        let resumed = match self.resumed_checkpoints(&id, token, kind).await {
            Ok(resumed) => resumed,
            Err(e) => {
                // Nothing ran: give the claim back before answering, so a retry finds it free.
                // The guard stays armed until then: a caller gone meanwhile still releases it.
                let now = self.clock.now();
                if let Err(release) = self.store.release(&id, token, now).await {
                    tracing::warn!(error = %release, "claim could not be released; the lease will run out");
                }
                if let Some(mut guard) = guard {
                    guard.armed = false;
                }
                tracing::error!(error = %e, "the checkpoints to resume from could not be read; nothing ran, claim released");
                return Err(e);
            }
        };
        let attempt = Attempt {
            store: self.store.clone(),
            clock: self.clock.clone(),
            id: id.clone(),
            token,
            number,
            kind,
            recorded: Arc::default(),
            policy: terms.policy,
            codec: self.codec.clone(),
            resumed: resumed.into(),
            lease: Lease::new(claimed_at + terms.policy.lease()),
        };
        let recorded = attempt.recorded.clone();
        let heartbeat = self.heartbeat_of(&attempt);
        // From here on the operation has started: a drop leaves the record `processing` (and
        // stops the heartbeat with the rest of this future).
        if let Some(mut guard) = guard {
            guard.armed = false;
        }
        let (value, outcome) = to_answer(beside(operation(attempt), heartbeat).await);
        let recorded = recorded.settle();
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(failed) => {
                // The effect happened: record "ran, answer not kept" rather than leave the record
                // to run again (as for an outcome too large, contract §2).
                tracing::error!(error = %failed.source, status = failed.status, "the operation's answer could not be serialised; recorded as 'ran, answer not kept'");
                if !recorded {
                    let kept = Outcome::not_serializable(failed.status, failed.class);
                    if let Err(e) = self.record(&terms.policy, &id, token, kept).await {
                        tracing::error!(error = %e, "'ran, answer not kept' could not be recorded either");
                    }
                }
                return Ok(Reply::Executed {
                    value,
                    outcome: Outcome::not_serializable(failed.status, failed.class),
                    attempt: number,
                    unrecorded: Some(Error::Serialize(failed.source)),
                });
            }
        };
        if recorded {
            transition!(
                INFO,
                "completed",
                status = outcome.status(),
                "outcome recorded by the operation's own transaction"
            );
            count_completion("completed");
            return Ok(Reply::Executed {
                value,
                outcome,
                attempt: number,
                unrecorded: None,
            });
        }
        let (outcome, unrecorded) = match self.record(&terms.policy, &id, token, outcome).await {
            Ok(outcome) => (outcome, None),
            // Fenced, too large, not recorded, not encoded: each carries the operation's outcome.
            Err(error) => match ErrorAnswer::of(&error) {
                ErrorAnswer::Answer(outcome) => (outcome.clone(), Some(error)),
                ErrorAnswer::Refuse(_) => return Err(error),
            },
        };
        Ok(Reply::Executed {
            value,
            outcome,
            attempt: number,
            unrecorded,
        })
    }
}

/// An operation's answer that could not be serialised: the status and class it would have had.
pub(crate) struct Unserializable {
    pub(crate) status: u16,
    pub(crate) class: OutcomeClass,
    pub(crate) source: serde_json::Error,
}

/// The error of a refusal that came without one: only a transport refuses so, never
/// [`Executor::run`]'s pipeline.
pub(crate) fn refused_without_error(refusal: crate::Refusal) -> Error {
    Error::Store(crate::StoreError::backend(refusal.title(), refusal.name()))
}
