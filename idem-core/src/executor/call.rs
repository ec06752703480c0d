//! [`Executor::execute`]: one call of a tool as a transport (HTTP, MCP, the proxy) serves it, from
//! the key and the wait it read to how the call was answered ([contract §5](crate::contract#http));
//! [`Executor::start`], the same call answered as soon as its claim is decided (MCP tasks); and
//! [`Executor::settle`], a record settled without running anything (a cancelled task).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;

use super::spawn::Spawner;
use super::{Attempt, Executor, Terms};
use crate::machine::ClaimAnswer;
use crate::{
    Error, ErrorAnswer, Fingerprint, IdempotencyKey, Outcome, RecordId, Refusal, Scope, StoreError,
    Tool,
};

/// One call of a protected tool, as its transport read it: the record it addresses, the request's
/// fingerprint, and the wait the caller asked for. Served by [`Executor::execute`] under its
/// [`Tool`]'s settings.
#[derive(Debug, Clone)]
pub struct Call {
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    wait: Duration,
    transport: &'static str,
}

impl Call {
    /// A call of the operation `fingerprint` names, under `key` (sent, or derived by
    /// [`Tool::key_of`]: its [`KeyOrigin`](crate::KeyOrigin) says) in `scope`; it asks for no
    /// wait.
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            wait: Duration::ZERO,
            transport: "",
        }
    }

    /// The wait the caller asked for (HTTP `Prefer: wait=N`, MCP `_meta["io.idem/wait"]`,
    /// [contract §5.2](crate::contract#waiting)); zero: none.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The transport's name in metrics (the `transport` label of `idem_refusals_total`), e.g.
    /// `"http"` or `"mcp"`.
    pub fn transport(mut self, name: &'static str) -> Self {
        self.transport = name;
        self
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }
}

/// How [`Executor::execute`] answered a [`Call`].
#[derive(Debug)]
pub struct Answer<V> {
    /// What the caller gets.
    pub reply: Reply<V>,
    /// The wait bound applied (the least of the requested wait and the tool's [maximum
    /// wait](crate::Tool::max_wait)) when the call asked to wait and found its operation in
    /// flight: what a transport reports (`Preference-Applied: wait=N`). `None` if it did not
    /// wait, or was waited for without asking (a derived key).
    pub waited: Option<Duration>,
}

impl<V> Answer<V> {
    /// The answer to a call its transport refused before it reached the executor (no key, an
    /// invalid key or body, no principal), counted in `idem_refusals_total{transport}` as every
    /// refusal is ([contract §8](crate::contract#observability)).
    pub fn refused(refusal: Refusal, transport: &'static str) -> Self {
        crate::metrics::count_refusal(transport, refusal.name());
        Self {
            reply: Reply::Refused {
                refusal,
                error: None,
            },
            waited: None,
        }
    }

    /// The answer of `error`, observed as every transport does.
    fn of_error(error: Error, transport: &'static str) -> Self {
        let refusal = match ErrorAnswer::observed(&error, transport) {
            ErrorAnswer::Refuse(refusal) => refusal,
            // An error that carries the operation's answer comes with its value, never here.
            ErrorAnswer::Answer(_) => Refusal::StoreError,
        };
        Self {
            reply: Reply::Refused {
                refusal,
                error: Some(error),
            },
            waited: None,
        }
    }
}

/// What a [`Call`] gets: the operation's answer, run now or replayed, or a refusal. Every
/// transport answers each of the three, so the set is closed (not `non_exhaustive`).
#[derive(Debug)]
pub enum Reply<V> {
    /// This call ran the operation: its value and the outcome made of it.
    Executed {
        /// What the operation returned beside its outcome.
        value: V,
        /// The outcome of the operation.
        outcome: Outcome,
        /// Which attempt ran it, from 1.
        attempt: u32,
        /// Why the record does not hold `outcome` as this attempt's, if it does not: fenced by
        /// a newer holder, too large (kept as "ran, not kept"), not recorded or not encoded (left
        /// to the lease). The caller still gets the answer: the effect happened.
        unrecorded: Option<Error>,
    },
    /// An earlier call ran the operation; this is its stored outcome.
    Replayed {
        /// The stored outcome.
        outcome: Outcome,
    },
    /// Nothing ran for this call ([contract §4](crate::contract#refusals)).
    Refused {
        /// What the transport answers.
        refusal: Refusal,
        /// The executor's error behind it; `None` for a call its transport refused.
        error: Option<Error>,
    },
}

/// What [`Executor::start`] answered.
#[derive(Debug)]
pub enum Started {
    /// This call won the claim: the operation runs on, detached, under the lease and the
    /// heartbeat, and records its outcome when it ends.
    Running {
        /// Which attempt runs it, from 1.
        attempt: u32,
    },
    /// Nothing started: the stored outcome (the operation ran before), the operation in flight
    /// in another attempt, or a refusal.
    Answered(Answer<()>),
}

impl Executor {
    /// Serves `call` of `tool` with `operation`: claims (waiting, as the call asked and the tool
    /// allows, at most the least of the requested wait, the tool's maximum wait and the holder's
    /// remaining lease; a derived key's call is waited for without asking unless the tool turned
    /// that off), runs, records or replays as [`Executor::run`] does, a derived key's record
    /// kept for the tool's key window. `operation` returns its value and the outcome to record.
    ///
    /// The claim, the operation and the completion run in a task of their own (through the
    /// executor's spawner, else on the current tokio runtime, else inline): a caller that goes
    /// away cannot stop the operation halfway, and its retry gets the recorded answer. A panic
    /// in `operation` is resumed in the caller.
    pub async fn execute<F, Fut, V>(&self, tool: &Tool, call: Call, operation: F) -> Answer<V>
    where
        F: FnOnce(Attempt) -> Fut + Send + 'static,
        Fut: Future<Output = (V, Outcome)> + Send + 'static,
        V: Send + 'static,
    {
        let transport = call.transport;
        let terms = Terms::of(tool, call.key.origin(), call.wait);
        // What a call that asked to wait is told it was given.
        let bound = call.wait.min(tool.max_wait());
        let Some(spawner) = self.spawn.detached() else {
            return self.execute_here(terms, bound, call, operation).await;
        };
        // The call's own task protects its claim and completion: no task hop for each.
        let executor = self.without_spawner();
        let answer = detached(&spawner, async move {
            executor.execute_here(terms, bound, call, operation).await
        });
        answer
            .await
            .unwrap_or_else(|| Answer::of_error(ended(), transport))
    }

    /// [`Executor::execute`] in the caller's task.
    async fn execute_here<F, Fut, V>(
        &self,
        terms: Terms,
        bound: Duration,
        call: Call,
        operation: F,
    ) -> Answer<V>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = (V, Outcome)>,
    {
        let Call {
            scope,
            key,
            fingerprint,
            transport,
            ..
        } = call;
        let span = Self::span(&scope, &key, &fingerprint);
        let (result, waited) = self
            .run_in_span(
                terms,
                &scope,
                &key,
                &fingerprint,
                operation,
                |(value, outcome)| (value, Ok(outcome)),
            )
            .instrument(span)
            .await;
        // Said only to a call that asked; one under a derived key that asked for nothing was
        // waited for without being told.
        let waited = waited.map(|_| bound).filter(|bound| !bound.is_zero());
        match result {
            Ok(reply) => Answer { reply, waited },
            Err(error) => Answer {
                waited,
                ..Answer::of_error(error, transport)
            },
        }
    }

    /// Serves `call` of `tool` as far as its claim: if the claim is won, `operation` starts
    /// detached (it runs on, records its outcome, renews its lease, whatever the caller does)
    /// and the answer is [`Started::Running`] at once; otherwise nothing starts and the answer
    /// is the replay, the in-flight refusal or another refusal. Nobody waits: the call's wait is
    /// ignored. What MCP tasks answer `tools/call` with ([contract §5.3](crate::contract#tasks)):
    /// the record is the task, read back from the store.
    ///
    /// Needs a spawner (the executor's, or a current tokio runtime); without one the operation
    /// runs before the answer.
    pub async fn start<F, Fut>(&self, tool: &Tool, call: Call, operation: F) -> Started
    where
        F: FnOnce(Attempt) -> Fut + Send + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let Call {
            scope,
            key,
            fingerprint,
            transport,
            ..
        } = call;
        let terms = Terms::of(tool, key.origin(), Duration::ZERO);
        let id = RecordId::new(scope, key);
        let span = Self::span(id.scope(), id.key(), &fingerprint);
        let claimed = self
            .claim(&terms.policy, &id, &fingerprint)
            .instrument(span.clone())
            .await;
        let (answer, guard, claimed_at) = match claimed {
            Ok(claimed) => claimed,
            Err(error) => return Started::Answered(Answer::of_error(error, transport)),
        };
        let ClaimAnswer::Claimed { attempt, .. } = answer else {
            let reply = self
                .after_claim(&terms, id, answer, guard, claimed_at, operation, |o| {
                    ((), Ok(o))
                })
                .instrument(span)
                .await;
            return Started::Answered(match reply {
                Ok(reply) => Answer {
                    reply,
                    waited: None,
                },
                Err(error) => Answer::of_error(error, transport),
            });
        };
        let executor = self.without_spawner();
        let run = async move {
            let _ = executor
                .after_claim(&terms, id, answer, guard, claimed_at, operation, |o| {
                    ((), Ok(o))
                })
                .instrument(span)
                .await;
        };
        match self.spawn.detached() {
            Some(spawner) => spawner(Box::pin(run)),
            None => run.await,
        }
        Started::Running { attempt }
    }

    /// Settles the record of `call` with `outcome` without running anything, as a call whose
    /// operation answered `outcome` at once: claims it (a record that is not claimable answers as
    /// for any call: the replay, in flight, a mismatch) and completes it. What a cancelled task
    /// leaves ([contract §5.3](crate::contract#tasks)): a release fenced like any claim, whose
    /// record then answers every repeat with `outcome`.
    pub async fn settle(&self, tool: &Tool, call: Call, outcome: Outcome) -> Answer<()> {
        let Call {
            scope,
            key,
            fingerprint,
            transport,
            ..
        } = call;
        let terms = Terms::of(tool, key.origin(), Duration::ZERO).without_wait();
        let id = RecordId::new(scope, key);
        let span = Self::span(id.scope(), id.key(), &fingerprint);
        let settled = async {
            let (answer, guard, claimed_at) = self.claim(&terms.policy, &id, &fingerprint).await?;
            let operation = move |_attempt| async move { outcome };
            self.after_claim(
                &terms,
                id.clone(),
                answer,
                guard,
                claimed_at,
                operation,
                |o| ((), Ok(o)),
            )
            .await
        };
        match settled.instrument(span).await {
            Ok(reply) => Answer {
                reply,
                waited: None,
            },
            Err(error) => Answer::of_error(error, transport),
        }
    }
}

/// Runs `task` on `spawner` to its end and hands back its output; `None` if the task was dropped
/// unfinished (the runtime is shutting down). A panic in the task is resumed here.
async fn detached<T: Send + 'static>(
    spawner: &Spawner,
    task: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = futures_channel::oneshot::channel();
    spawner(Box::pin(async move {
        let _ = tx.send(AssertUnwindSafe(task).catch_unwind().await);
    }));
    match rx.await {
        Ok(Ok(output)) => Some(output),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => None,
    }
}

fn ended() -> Error {
    Error::Store(StoreError::backend(
        "the call's task ended without an answer (the runtime is shutting down)",
        "task dropped",
    ))
}
