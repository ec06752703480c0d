//! [`Executor::call`]: one call of a protected tool as a transport (HTTP, MCP) serves it, from
//! the key and the wait it read to how the call was answered ([contract §5](crate::contract#http)).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;

use super::{Attempt, Executor};
use crate::{
    Error, ErrorAnswer, Fingerprint, IdempotencyKey, KeyOrigin, Outcome, Refusal, Scope, StoreError,
};

/// One call of a protected tool, as its transport read it: the record it addresses, the request's
/// fingerprint, and what the caller asked for. Served by [`Executor::call`].
#[derive(Debug, Clone)]
pub struct Call {
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    wait: Duration,
    key_window: Option<Duration>,
    transport: &'static str,
}

impl Call {
    /// A call of the operation `fingerprint` names, under `key` (sent, or derived: its
    /// [`KeyOrigin`] says) in `scope`; it asks for no wait.
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            wait: Duration::ZERO,
            key_window: None,
            transport: "",
        }
    }

    /// The wait the caller asked for (HTTP `Prefer: wait=N`, MCP `_meta["io.idem/wait"]`,
    /// [contract §5.2](crate::contract#waiting)); zero: none.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long the record of a derived key is kept: the tool's key window ([contract
    /// §5.1](crate::contract#keyless)). A sent key's record keeps the policy's ttl.
    pub fn key_window(mut self, window: Duration) -> Self {
        self.key_window = Some(window);
        self
    }

    /// The transport's name in metrics (the `transport` label of `idem_refusals_total`), e.g.
    /// `"http"` or `"mcp"`.
    pub fn transport(mut self, name: &'static str) -> Self {
        self.transport = name;
        self
    }
}

/// How [`Executor::call`] answered a [`Call`].
#[derive(Debug)]
pub struct Answer<V> {
    /// What the caller gets.
    pub reply: Reply<V>,
    /// The wait bound applied (the least of the requested wait and the [maximum
    /// wait](Executor::with_max_wait)) when the call asked to wait and found its operation in
    /// flight: what a transport reports (`Preference-Applied: wait=N`). `None` if it did not
    /// wait, or was waited for without asking (a derived key).
    pub waited: Option<Duration>,
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
        /// Why.
        error: Error,
    },
}

impl Executor {
    /// Serves `call` with `operation`: under a derived key the record is kept for the call's key
    /// window and a caller that did not ask to wait is waited for (as
    /// [`with_derived_key_wait`](Executor::with_derived_key_wait) says); waits at most the least
    /// of the requested wait, the maximum wait and the holder's remaining lease; claims, runs,
    /// records or replays as [`Executor::run`] does. `operation` returns its value and the
    /// outcome to record.
    ///
    /// The claim, the operation and the completion run in a task of their own (through the
    /// executor's spawner, else on the current tokio runtime, else inline): a caller that goes
    /// away cannot stop the operation halfway, and its retry gets the recorded answer. A panic
    /// in `operation` is resumed in the caller.
    pub async fn call<F, Fut, V>(&self, call: Call, operation: F) -> Answer<V>
    where
        F: FnOnce(Attempt) -> Fut + Send + 'static,
        Fut: Future<Output = (V, Outcome)> + Send + 'static,
        V: Send + 'static,
    {
        let transport = call.transport;
        let Some(spawner) = self.spawn.detached() else {
            return self.without_spawner().call_here(call, operation).await;
        };
        // The call's own task protects its claim and completion: no task hop for each.
        let executor = self.without_spawner();
        let (tx, rx) = futures_channel::oneshot::channel();
        spawner(Box::pin(async move {
            let answer = AssertUnwindSafe(executor.call_here(call, operation))
                .catch_unwind()
                .await;
            let _ = tx.send(answer);
        }));
        match rx.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => {
                let error = Error::Store(StoreError::backend(
                    "the call's task ended without an answer (the runtime is shutting down)",
                    "task dropped",
                ));
                Answer {
                    reply: refused(error, transport),
                    waited: None,
                }
            }
        }
    }

    /// [`Executor::call`] in the caller's task.
    async fn call_here<F, Fut, V>(&self, call: Call, operation: F) -> Answer<V>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = (V, Outcome)>,
    {
        let Call {
            scope,
            key,
            fingerprint,
            wait,
            key_window,
            transport,
        } = call;
        let mut executor = match wait.is_zero() {
            true => self.clone(),
            false => self.waiting(wait),
        };
        if let (Some(window), false) = (key_window, key.origin() == KeyOrigin::Sent) {
            match self.policy.to_builder().ttl(window).build() {
                Ok(policy) => executor.policy = policy,
                Err(e) => {
                    tracing::error!(error = %e, "the key window does not fit the executor's lease; nothing ran");
                    let message = format!("the key window does not fit the lease: {e}");
                    let error = Error::Store(StoreError::Misconfigured { message });
                    return Answer {
                        reply: refused(error, transport),
                        waited: None,
                    };
                }
            }
        }
        let span = Self::span(&scope, &key, &fingerprint);
        let mut waited = None;
        let result = executor
            .run_in_span(
                &scope,
                &key,
                &fingerprint,
                operation,
                |(value, outcome)| (value, Ok(outcome)),
                &mut waited,
            )
            .instrument(span)
            .await;
        // Said only to a call that asked; one under a derived key that asked for nothing was
        // waited for without being told.
        let waited = waited
            .map(|_| executor.wait_bound())
            .filter(|bound| !bound.is_zero());
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => refused(error, transport),
        };
        Answer { reply, waited }
    }
}

/// The refusal of `error`, observed as every transport does ([`ErrorAnswer::observed`]).
fn refused<V>(error: Error, transport: &'static str) -> Reply<V> {
    let refusal = match ErrorAnswer::observed(&error, transport) {
        ErrorAnswer::Refuse(refusal) => refusal,
        // An error that carries the operation's answer comes with its value, never here.
        ErrorAnswer::Answer(_) => Refusal::StoreError,
    };
    Reply::Refused { refusal, error }
}
