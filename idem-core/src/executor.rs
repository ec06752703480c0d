//! [`Executor`]: claim, run at most once, record, replay.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_channel::oneshot;
use tracing::Instrument;

use crate::codec::{CodecContext, CodecError, OutcomeCodec, decode_outcome, encode_outcome};
use crate::machine::{
    ClaimAnswer, ClaimKind, CompleteAnswer, ExtendAnswer, OutcomeTooLarge, completed_state,
};
use crate::{
    Clock, Error, Fingerprint, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Policy, Scope,
    StoreError, SystemClock, Timestamp, Token, downstream_key,
};

/// A future handed to a [`Executor::with_spawner`] spawner.
pub type BackgroundTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

type Spawner = Arc<dyn Fn(BackgroundTask) + Send + Sync>;

/// What [`Executor::run`] returns when it has an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// This call ran the operation, and its outcome was recorded.
    Executed {
        /// What the operation answered.
        outcome: Outcome,
        /// Which attempt ran it, from 1.
        attempt: u32,
    },
    /// An earlier call ran the operation; this is its stored outcome.
    Replayed {
        /// The stored outcome.
        outcome: Outcome,
    },
}

impl Execution {
    /// The outcome, executed or replayed.
    pub fn outcome(&self) -> &Outcome {
        match self {
            Self::Executed { outcome, .. } | Self::Replayed { outcome } => outcome,
        }
    }

    /// The outcome, executed or replayed.
    pub fn into_outcome(self) -> Outcome {
        match self {
            Self::Executed { outcome, .. } | Self::Replayed { outcome } => outcome,
        }
    }

    /// Whether this is a replay of an earlier execution.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed { .. })
    }
}

/// The claim an operation runs under, handed to the operation by [`Executor::run`].
#[derive(Clone)]
pub struct Attempt {
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    scope: Scope,
    key: IdempotencyKey,
    token: Token,
    number: u32,
    kind: ClaimKind,
    recorded: Arc<AtomicBool>,
    policy: Policy,
    codec: Option<Arc<dyn OutcomeCodec>>,
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("token", &self.token)
            .field("number", &self.number)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Attempt {
    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The fencing token of this claim.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Which attempt this is, from 1.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// How the claim was won.
    pub fn kind(&self) -> ClaimKind {
        self.kind
    }

    /// Now, by the executor's clock: the time a store's transactional completion writes at.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Renews the lease to `now + lease` (a heartbeat for long work); it never shortens the lease
    /// (the later deadline wins). `Ok(false)` means the claim was lost: stop, and do not start
    /// any further effect. A lease of zero whole milliseconds is refused with
    /// [`StoreError::ZeroLease`] before the store is called.
    pub async fn extend(&self, lease: Duration) -> Result<bool, StoreError> {
        crate::machine::check_lease(lease)?;
        let now = self.clock.now();
        let answer = timed(
            &*self.store,
            "extend",
            self.store
                .extend(&self.scope, &self.key, self.token, lease, now),
        )
        .await?;
        Ok(match answer {
            ExtendAnswer::Extended { lease_until } => {
                transition!(
                    DEBUG,
                    "extended",
                    lease_until = lease_until.as_millis(),
                    "lease extended"
                );
                true
            }
            ExtendAnswer::Fenced => {
                transition!(
                    WARN,
                    "fenced",
                    op = "extend",
                    "lease lost to a newer attempt"
                );
                count_completion("fenced");
                false
            }
        })
    }

    /// Tells the executor that the operation has completed the record itself, in the same
    /// committed transaction as its effect ([contract §6](crate::contract#transactional-completion), transactional completion: e.g.
    /// `SqliteStore`'s or `PostgresStore`'s completion on the caller's transaction), so the
    /// executor must not complete it again. The stores' `complete_in(tx, &attempt, &outcome)` mark
    /// it themselves unless fenced; a completion made any other way calls it after its transaction
    /// committed. Clones of the attempt share the mark.
    pub fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::SeqCst);
    }

    /// The executor's policy: the one a store's transactional completion (e.g.
    /// `SqliteStore::complete_in`, `PostgresStore::complete_in`, which take the attempt) completes
    /// under, so the record gets the same ttl, cache policy and size limit as the executor's own
    /// completions.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The outcome to store for `outcome`: encoded by the executor's [codec](crate::codec)
    /// (e.g. encrypted), or `outcome` itself without one. Pass this, not the plain outcome, to a
    /// store's transactional completion, so a record completed in your transaction is stored as
    /// the executor would store it (and replays through the codec). Return the plain outcome
    /// from the operation.
    pub fn encode(&self, outcome: &Outcome) -> Result<Outcome, CodecError> {
        encode_outcome(
            self.codec.as_deref(),
            &CodecContext::new(&self.scope, &self.key),
            outcome,
        )
        .map(|o| o.into_owned())
    }

    /// The stable key to pass to `provider`'s own idempotency contract; see [`downstream_key`].
    pub fn downstream_key(&self, provider: &str) -> String {
        downstream_key(&self.scope, &self.key, provider)
    }
}

/// Gives a won claim back if dropped before being disarmed (needs a spawner: the release is
/// asynchronous).
struct ReleaseOnDrop {
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    spawner: Spawner,
    scope: Scope,
    key: IdempotencyKey,
    token: Token,
    armed: bool,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, clock) = (self.store.clone(), self.clock.clone());
        let (scope, key, token) = (self.scope.clone(), self.key.clone(), self.token);
        (self.spawner)(Box::pin(async move {
            match timed(
                &*store,
                "release",
                store.release(&scope, &key, token, clock.now()),
            )
            .await
            {
                Ok(answer) => {
                    transition!(INFO, "released", scope = %scope, key = %key, token = %token.short(), ?answer,
                        "caller went away before the operation started; claim released"
                    )
                }
                Err(error) => {
                    transition!(WARN, "released", scope = %scope, key = %key, token = %token.short(), %error,
                        "caller went away before the operation started; release failed, the lease will run out"
                    )
                }
            }
        }));
    }
}

/// Runs operations at most once per (scope, key): claim, run, complete, or replay.
///
/// ```
/// use idem_core::{Executor, Fingerprint, IdempotencyKey, MemoryStore, Outcome, Scope};
/// use serde_json::json;
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let executor = Executor::new(MemoryStore::new());
/// let scope = Scope::new("tenant-a/create_ticket").unwrap();
/// let key = IdempotencyKey::new("wf-1:step-3:create_ticket").unwrap();
/// let args = json!({"title": "Printer on fire", "account_id": "A-7"});
/// let fp = Fingerprint::of("create_ticket", &args).unwrap();
///
/// let first = executor
///     .run(&scope, &key, &fp, |_attempt| async { Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap() })
///     .await
///     .unwrap();
/// let again = executor
///     .run(&scope, &key, &fp, |_attempt| async { unreachable!("never runs twice") })
///     .await
///     .unwrap();
/// assert!(!first.is_replay() && again.is_replay());
/// assert_eq!(first.outcome(), again.outcome());
/// # });
/// ```
///
/// # Cancellation ([contract §2](crate::contract#states))
///
/// With a spawner ([`Executor::with_spawner`]), the claim and the completion run as background
/// tasks, so dropping the caller's future cannot lose them: a claim won after the caller went
/// away (before the operation started) is released, and an outcome that is being recorded is
/// recorded. Dropping the future while the operation runs leaves the record `processing` (the
/// effect may have happened) for the lease and reconciliation. Without a spawner, dropping the
/// future while the claim is in the store may leave a `processing` record behind, which the lease
/// and reconciliation then settle.
#[derive(Clone)]
pub struct Executor {
    store: Arc<dyn KeyStore>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    spawner: Option<Spawner>,
    codec: Option<Arc<dyn OutcomeCodec>>,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .field("spawner", &self.spawner.is_some())
            .field("codec", &self.codec)
            .finish()
    }
}

impl Executor {
    /// An executor over `store` with the default policy and the system clock.
    pub fn new(store: impl KeyStore) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// An executor over a shared store.
    pub fn from_arc(store: Arc<dyn KeyStore>) -> Self {
        Self {
            store,
            policy: Policy::default(),
            clock: Arc::new(SystemClock),
            spawner: None,
            codec: None,
        }
    }

    /// Uses `policy`.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Reads time from `clock`.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs the claim and the completion as background tasks through `spawn`, so a dropped
    /// caller cannot lose them (see "Cancellation"). With tokio:
    /// `executor.with_spawner(|task| { tokio::spawn(task); })`.
    pub fn with_spawner(mut self, spawn: impl Fn(BackgroundTask) + Send + Sync + 'static) -> Self {
        self.spawner = Some(Arc::new(spawn));
        self
    }

    /// Encodes every outcome with `codec` before it is stored and decodes every stored outcome
    /// before it is replayed (encryption, redaction: see [`codec`](crate::codec)). The status,
    /// the class, the fingerprint and the record's metadata stay clear. A stored outcome that
    /// does not decode is [`Error::Decode`]: nothing runs and nothing is replayed.
    pub fn with_codec(mut self, codec: impl OutcomeCodec) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }

    /// The codec, if one is set.
    pub fn codec(&self) -> Option<&Arc<dyn OutcomeCodec>> {
        self.codec.as_ref()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The [`Attempt`] of a claim made on the store directly ([`KeyStore::claim`] answered
    /// `claimed`), with this executor's store, clock, policy and codec: what a store's
    /// transactional completion takes when the claim did not come from [`Executor::run`] (a
    /// tool of your own, a test). `None` for any other answer.
    pub fn attempt_for(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        claim: &ClaimAnswer,
    ) -> Option<Attempt> {
        let ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
        } = *claim
        else {
            return None;
        };
        Some(Attempt {
            store: self.store.clone(),
            clock: self.clock.clone(),
            scope: scope.clone(),
            key: key.clone(),
            token,
            number: attempt,
            kind,
            recorded: Arc::new(AtomicBool::new(false)),
            policy: self.policy,
            codec: self.codec.clone(),
        })
    }

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
        let ran = self
            .run_in_span(scope, key, fingerprint, operation, |o| ((), Ok(o)))
            .instrument(span)
            .await?;
        Ok(match ran {
            Ran::Executed {
                outcome, attempt, ..
            } => Execution::Executed { outcome, attempt },
            Ran::Replayed(outcome) => Execution::Replayed { outcome },
        })
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

    /// Claims, runs, records or replays; `to_answer` turns the operation's output into the value
    /// handed back and the outcome to record.
    pub(crate) async fn run_in_span<F, Fut, O, V>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        operation: F,
        to_answer: impl FnOnce(O) -> (V, Result<Outcome, Unserializable>),
    ) -> Result<Ran<V>, Error>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = O>,
    {
        let (answer, guard) = self.claim(scope, key, fingerprint).await?;
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
                        count_claim("replayed");
                        return Err(Error::Decode(e));
                    }
                };
                transition!(
                    INFO,
                    "replayed",
                    status = outcome.status(),
                    "replaying stored outcome"
                );
                count_claim("replayed");
                return Ok(Ran::Replayed(outcome));
            }
            ClaimAnswer::InFlight { retry_after, stale } => {
                transition!(
                    INFO,
                    "in_flight",
                    retry_after_ms = retry_after.as_millis() as u64,
                    stale,
                    "operation in flight"
                );
                count_claim("in_flight");
                return Err(Error::InFlight { retry_after, stale });
            }
            ClaimAnswer::FingerprintMismatch => {
                transition!(WARN, "mismatch", "key reused with a different request");
                count_claim("mismatch");
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
                count_claim("taken_over");
            }
            ClaimKind::ExpiredReplaced => {
                transition!(INFO, "expired_replaced", "expired record replaced");
                count_claim("claimed");
            }
            ClaimKind::New | ClaimKind::Retry => {
                transition!(INFO, "claimed", attempt = number, ?kind, "claimed");
                count_claim("claimed");
            }
        }

        let attempt = Attempt {
            store: self.store.clone(),
            clock: self.clock.clone(),
            scope: scope.clone(),
            key: key.clone(),
            token,
            number,
            kind,
            recorded: Arc::new(AtomicBool::new(false)),
            policy: self.policy,
            codec: self.codec.clone(),
        };
        let recorded = attempt.recorded.clone();
        // From here on the operation has started: a drop leaves the record `processing`.
        if let Some(mut guard) = guard {
            guard.armed = false;
        }
        let (value, outcome) = to_answer(operation(attempt).await);
        let recorded = recorded.load(Ordering::SeqCst);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(failed) => {
                // The effect happened: record "ran, answer not kept" rather than leave the record
                // to run again (as for an outcome too large, contract §2).
                tracing::error!(error = %failed.source, status = failed.status, "the operation's answer could not be serialised; recorded as 'ran, answer not kept'");
                if !recorded {
                    let kept = Outcome::not_serializable(failed.status, failed.class);
                    if let Err(e) = self.record(scope, key, token, kept).await {
                        tracing::error!(error = %e, "'ran, answer not kept' could not be recorded either");
                    }
                }
                return Err(Error::Serialize(failed.source));
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
            return Ok(Ran::Executed {
                value,
                outcome,
                attempt: number,
            });
        }
        let outcome = self.record(scope, key, token, outcome).await?;
        Ok(Ran::Executed {
            value,
            outcome,
            attempt: number,
        })
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<(ClaimAnswer, Option<ReleaseOnDrop>), Error> {
        let now = self.clock.now();
        let Some(spawner) = &self.spawner else {
            let answer = timed(
                &*self.store,
                "claim",
                self.store.claim(scope, key, fingerprint, &self.policy, now),
            )
            .await?;
            return Ok((answer, None));
        };
        let (tx, rx) = oneshot::channel();
        let store = self.store.clone();
        let (clock, spawn) = (self.clock.clone(), spawner.clone());
        let (scope, key, fingerprint, policy) =
            (scope.clone(), key.clone(), fingerprint.clone(), self.policy);
        spawner(Box::pin(async move {
            let result = timed(
                &*store,
                "claim",
                store.claim(&scope, &key, &fingerprint, &policy, now),
            )
            .await
            .map(|answer| {
                // Armed until the operation starts; dropped unsent or unread, it releases.
                let guard = match &answer {
                    ClaimAnswer::Claimed { token, .. } => Some(ReleaseOnDrop {
                        store: store.clone(),
                        clock,
                        spawner: spawn,
                        scope,
                        key,
                        token: *token,
                        armed: true,
                    }),
                    _ => None,
                };
                (answer, guard)
            });
            let _ = tx.send(result);
        }));
        match rx.await {
            Ok(result) => Ok(result?),
            Err(oneshot::Canceled) => Err(Error::Store(StoreError::Unavailable {
                message: "the background claim task was dropped (runtime shutting down?)".into(),
                source: None,
            })),
        }
    }

    async fn record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: Outcome,
    ) -> Result<Outcome, Error> {
        let now = self.clock.now();
        let result = match &self.spawner {
            None => {
                complete_or_not_kept(
                    &*self.store,
                    self.codec.as_deref(),
                    scope,
                    key,
                    token,
                    &outcome,
                    &self.policy,
                    now,
                )
                .await
            }
            Some(spawner) => {
                let (tx, rx) = oneshot::channel();
                let (store, codec) = (self.store.clone(), self.codec.clone());
                let (scope, key, policy, outcome) =
                    (scope.clone(), key.clone(), self.policy, outcome.clone());
                // Recorded even if the caller goes away meanwhile: the effect has happened.
                spawner(Box::pin(async move {
                    let result = complete_or_not_kept(
                        &*store,
                        codec.as_deref(),
                        &scope,
                        &key,
                        token,
                        &outcome,
                        &policy,
                        now,
                    )
                    .await;
                    let _ = tx.send(result);
                }));
                rx.await.unwrap_or_else(|oneshot::Canceled| {
                    Err(CompletionError::Store(StoreError::Unavailable {
                        message: "the background completion task was dropped".into(),
                        source: None,
                    }))
                })
            }
        };
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
                count_completion(match completed_state(&outcome, &self.policy) {
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

/// What [`Executor::run_in_span`] did.
pub(crate) enum Ran<V> {
    /// This call ran the operation.
    Executed {
        value: V,
        outcome: Outcome,
        attempt: u32,
    },
    /// A stored outcome, decoded.
    Replayed(Outcome),
}

/// An operation's answer that could not be serialised: the status and class it would have had.
pub(crate) struct Unserializable {
    pub(crate) status: u16,
    pub(crate) class: OutcomeClass,
    pub(crate) source: serde_json::Error,
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

/// Completes the record with `outcome` encoded by `codec`; if that is over the policy's limit,
/// completes it with [`Outcome::not_kept`] (encoded too) instead ([contract §2](crate::contract#states): a record is never left `processing` because its
/// outcome could not be kept). The replacement is small and bounded; it is stored under the same
/// policy with the limit raised to its size if the limit is smaller still, so it always fits.
// The arguments of `KeyStore::complete`, plus the codec.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn complete_or_not_kept(
    store: &dyn KeyStore,
    codec: Option<&dyn OutcomeCodec>,
    scope: &Scope,
    key: &IdempotencyKey,
    token: Token,
    outcome: &Outcome,
    policy: &Policy,
    now: Timestamp,
) -> Result<Completion, CompletionError> {
    let cx = CodecContext::new(scope, key);
    // The limit applies to what is stored: the encoded outcome.
    let stored = encode_outcome(codec, &cx, outcome).map_err(CompletionError::Encode)?;
    let too_large = match crate::machine::check_outcome_size(&stored, policy) {
        Ok(()) => {
            let completed = store.complete(scope, key, token, &stored, policy, now);
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
        store.complete(scope, key, token, &kept, &roomy, now),
    )
    .await?;
    Ok(Completion {
        answer,
        not_kept: Some(too_large),
    })
}

fn count_claim(result: &'static str) {
    metrics::counter!(crate::metrics::CLAIMS, "result" => result).increment(1);
}

fn count_completion(result: &'static str) {
    metrics::counter!(crate::metrics::COMPLETIONS, "result" => result).increment(1);
}

/// Times a store call ([`crate::metrics::timed`]).
async fn timed<T>(
    store: &dyn KeyStore,
    op: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    crate::metrics::timed(store.backend(), op, call).await
}
