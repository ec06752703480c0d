//! The executor's steps: claim and record (run inline, or through the spawner so a dropped caller
//! cannot cancel them), completion with its "not kept" fallback.

use std::future::Future;

use futures_channel::oneshot;

use super::observe::{count_completion, timed};
use super::{Executor, attempt::ReleaseOnDrop};
use crate::codec::{CodecContext, CodecError, OutcomeCodec, encode_outcome};
use crate::machine::{ClaimAnswer, CompleteAnswer, OutcomeTooLarge, completed_state};
use crate::{
    Error, Fingerprint, KeyStore, Outcome, Policy, RecordId, StoreError, Timestamp, Token,
};

impl Executor {
    /// Runs `task` to its end whatever the caller does: through the spawner, awaiting its result,
    /// so dropping the caller's future cannot cancel it; without a spawner, inline. `None`: the
    /// spawned task was dropped unfinished (the runtime is shutting down).
    async fn on_spawner<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let Some(spawner) = self.spawn.here() else {
            return Some(task.await);
        };
        let (tx, rx) = oneshot::channel();
        spawner(Box::pin(async move {
            // Unread (the caller went away), the result is dropped here: a won claim's guard
            // then releases it.
            let _ = tx.send(task.await);
        }));
        rx.await.ok()
    }

    /// Claims `id` at the clock's `now`, which it answers too (a won lease runs until
    /// `now + lease`). With a spawner, a won claim comes with a guard that releases it if
    /// dropped before the operation starts.
    pub(super) async fn claim(
        &self,
        policy: &Policy,
        id: &RecordId,
        fingerprint: &Fingerprint,
    ) -> Result<(ClaimAnswer, Option<ReleaseOnDrop>, Timestamp), Error> {
        let now = self.clock.now();
        let (store, clock, spawner) = (self.store.clone(), self.clock.clone(), self.spawn.here());
        let (id, fingerprint, policy) = (id.clone(), fingerprint.clone(), *policy);
        let claimed = self.on_spawner(async move {
            let answer = timed(
                &*store,
                "claim",
                store.claim(&id, &fingerprint, &policy, now),
            )
            .await?;
            // Armed until the operation starts; dropped unsent or unread, it releases.
            let guard = match (&answer, spawner) {
                (ClaimAnswer::Claimed { token, .. }, Some(spawner)) => Some(ReleaseOnDrop {
                    store: store.clone(),
                    clock,
                    spawner,
                    id,
                    token: *token,
                    armed: true,
                }),
                _ => None,
            };
            Ok((answer, guard, now))
        });
        claimed.await.unwrap_or_else(|| {
            Err(Error::Store(StoreError::Unavailable {
                message: "the background claim task was dropped (runtime shutting down?)".into(),
                source: None,
            }))
        })
    }

    /// Records `outcome` under the claim `token`; with a spawner, it is recorded even if the
    /// caller goes away meanwhile (the effect has happened).
    pub(super) async fn record(
        &self,
        policy: &Policy,
        id: &RecordId,
        token: Token,
        outcome: Outcome,
    ) -> Result<Outcome, Error> {
        let now = self.clock.now();
        let (store, codec) = (self.store.clone(), self.codec.clone());
        let (id, stored) = (id.clone(), outcome.clone());
        let policy = *policy;
        let completed = self.on_spawner(async move {
            let held = Held {
                store: &*store,
                codec: codec.as_deref(),
                id: &id,
                token,
            };
            complete_or_not_kept(held, &stored, &policy, now).await
        });
        let result = completed.await.unwrap_or_else(|| {
            Err(CompletionError::Store(StoreError::Unavailable {
                message: "the background completion task was dropped".into(),
                source: None,
            }))
        });
        match result {
            Ok(Completion {
                answer: CompleteAnswer::Completed | CompleteAnswer::MarkedRetryable,
                not_kept: Some(e),
            }) => {
                transition!(
                    WARN,
                    "completed",
                    outcome_not_kept = true,
                    status = outcome.status(),
                    size = e.size,
                    limit = e.limit,
                    "outcome over the size limit: recorded as 'ran, response not kept' (the final answer for retries); this caller gets the real answer"
                );
                count_completion(match completed_state(&outcome, &policy) {
                    crate::RecordState::Completed => "completed",
                    _ => "retryable",
                });
                Err(Error::OutcomeTooLarge {
                    outcome: Box::new(outcome),
                    size: e.size,
                    limit: e.limit,
                })
            }
            Ok(Completion {
                answer: CompleteAnswer::Completed,
                ..
            }) => {
                transition!(
                    INFO,
                    "completed",
                    status = outcome.status(),
                    "outcome recorded"
                );
                count_completion("completed");
                Ok(outcome)
            }
            Ok(Completion {
                answer: CompleteAnswer::MarkedRetryable,
                ..
            }) => {
                transition!(
                    INFO,
                    "marked_retryable",
                    status = outcome.status(),
                    "retryable outcome; the next attempt runs again"
                );
                count_completion("retryable");
                Ok(outcome)
            }
            Ok(Completion {
                answer: CompleteAnswer::Fenced,
                ..
            }) => {
                transition!(
                    WARN,
                    "fenced",
                    op = "complete",
                    "claim lost to a newer attempt; outcome not stored"
                );
                count_completion("fenced");
                Err(Error::Fenced {
                    outcome: Box::new(outcome),
                })
            }
            Err(CompletionError::Store(source)) => {
                tracing::error!(error = %source, "outcome could not be recorded; record left processing");
                Err(Error::NotRecorded {
                    outcome: Box::new(outcome),
                    source,
                })
            }
            Err(CompletionError::Encode(source)) => {
                tracing::error!(error = %source, "outcome could not be encoded; nothing stored, record left processing");
                Err(Error::Encode {
                    outcome: Box::new(outcome),
                    source,
                })
            }
        }
    }
}

/// Why a completion stored nothing.
pub(crate) enum CompletionError {
    /// The store failed.
    Store(StoreError),
    /// The codec could not encode the outcome.
    Encode(CodecError),
}

impl From<StoreError> for CompletionError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// What a completion did: the store's answer, and whether the outcome was over the limit and
/// [`Outcome::not_kept`] was stored in its place.
pub(crate) struct Completion {
    pub(crate) answer: CompleteAnswer,
    pub(crate) not_kept: Option<OutcomeTooLarge>,
}

/// The claim a completion writes under: the store and codec, the record's address and the
/// holder's token.
pub(crate) struct Held<'a> {
    pub(crate) store: &'a dyn KeyStore,
    pub(crate) codec: Option<&'a dyn OutcomeCodec>,
    pub(crate) id: &'a RecordId,
    pub(crate) token: Token,
}

/// Completes the record with `outcome` encoded by `codec`; if that is over the policy's limit,
/// completes it with [`Outcome::not_kept`] (encoded too) instead ([contract
/// §2](crate::contract#states): a record is never left `processing` because its outcome could not
/// be kept). The replacement is small and bounded; it is stored under the same policy with the
/// limit raised to its size if the limit is smaller still, so it always fits.
pub(crate) async fn complete_or_not_kept(
    held: Held<'_>,
    outcome: &Outcome,
    policy: &Policy,
    now: Timestamp,
) -> Result<Completion, CompletionError> {
    let Held {
        store,
        codec,
        id,
        token,
    } = held;
    let cx = CodecContext::new(id.scope(), id.key());
    // The limit applies to what is stored: the encoded outcome.
    let stored = encode_outcome(codec, &cx, outcome).map_err(CompletionError::Encode)?;
    let too_large = match crate::machine::check_outcome_size(&stored, policy) {
        Ok(()) => {
            let completed = store.complete(id, token, &stored, policy, now);
            match timed(store, "complete", completed).await {
                Ok(answer) => {
                    return Ok(Completion {
                        answer,
                        not_kept: None,
                    });
                }
                // A store whose own limit is stricter refused it: the same case.
                Err(StoreError::OutcomeTooLarge(e)) => e,
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => e,
    };
    let kept = Outcome::not_kept(&stored, too_large.limit);
    let kept = encode_outcome(codec, &cx, &kept)
        .map_err(CompletionError::Encode)?
        .into_owned();
    let roomy = policy
        .to_builder()
        .max_outcome_bytes(policy.max_outcome_bytes().max(kept.size()))
        .build()
        .expect("the same valid policy with a larger limit is valid");
    let answer = timed(
        store,
        "complete",
        store.complete(id, token, &kept, &roomy, now),
    )
    .await?;
    Ok(Completion {
        answer,
        not_kept: Some(too_large),
    })
}
