//! [`Executor`]: claim, run at most once, record, replay.
//!
//! The executor (the deployment: store, clock, codec, spawner, heartbeat) lives here;
//! [`Executor::run`] in `run`; [`Executor::execute`], one [`Call`] of a [`Tool`] as a transport
//! serves it, with [`Executor::start`] and [`Executor::settle`] for tasks, in `call`;
//! [`Executor::read`], a record as a replay decodes it, in `read`; [`Attempt`] (and the guard
//! that gives an abandoned claim back) in `attempt`; the claim and record steps and the
//! completion in `steps`; the counters in `observe`; waiting in `wait`, and the terms a call runs
//! under and what an in-flight answer says in `in_flight`; checkpoints in `checkpoints`; renewing
//! a running operation's lease in `heartbeat`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::OutcomeCodec;
use crate::machine::ClaimAnswer;
use crate::{Clock, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, SystemClock, Tool};

mod attempt;
mod call;
mod checkpoints;
mod heartbeat;
mod in_flight;
mod observe;
mod read;
mod run;
mod spawn;
mod steps;
mod wait;

pub use attempt::Attempt;
pub use call::{Answer, Call, Reply, Started};
pub(crate) use in_flight::Terms;
pub(crate) use run::{Unserializable, refused_without_error};
pub use spawn::BackgroundTask;
use spawn::Spawn;
pub(crate) use steps::{CompletionError, Held, complete_or_not_kept};

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
/// Inside a tokio runtime (with the `tokio` feature, on by default) or with a spawner of your own
/// ([`Executor::with_spawner`]), the claim and the completion run as background tasks, so
/// dropping the caller's future cannot lose them: a claim won after the caller went away (before
/// the operation started) is released, and an outcome that is being recorded is recorded.
/// Dropping the future while the operation runs leaves the record `processing` (the effect may
/// have happened) for the lease and reconciliation, and stops the operation's heartbeat
/// ([`Executor::with_heartbeat`]): work the operation spawned that outlives the call is no
/// longer renewed, and must finish by [`Attempt::lease_until`] or renew the lease itself.
/// Without a spawner (outside a tokio runtime, without the `tokio` feature, or after
/// [`Executor::without_spawner`]), dropping the future while the claim is in the store may leave
/// a `processing` record behind, which the lease and reconciliation then settle.
#[derive(Clone)]
pub struct Executor {
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    spawn: Spawn,
    codec: Option<Arc<dyn OutcomeCodec>>,
    waiting: wait::Waiting,
    heartbeat: heartbeat::Heartbeat,
    /// The tool [`Executor::run`] and [`Executor::run_typed`] run their operations as.
    tool: Tool,
    /// The wait a caller of [`Executor::run`] asked for ([`Executor::waiting`]).
    wait: Duration,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("spawner", &self.spawn.name())
            .field("codec", &self.codec)
            .field("heartbeat", &self.heartbeat)
            .field("tool", &self.tool)
            .field("wait", &self.wait)
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
            clock: Arc::new(SystemClock),
            spawn: Spawn::default_for_build(),
            codec: None,
            waiting: wait::Waiting::new(),
            heartbeat: heartbeat::Heartbeat::default(),
            tool: Tool::default(),
            wait: Duration::ZERO,
        }
    }

    /// Runs [`Executor::run`]'s and [`Executor::run_typed`]'s operations as `tool` (default
    /// [`Tool::default`]). A transport passes each call's tool instead ([`Executor::execute`]).
    pub fn with_tool(mut self, tool: Tool) -> Self {
        self.tool = tool;
        self
    }

    /// The tool [`Executor::run`] runs its operations as.
    pub fn tool(&self) -> &Tool {
        &self.tool
    }

    /// Runs [`Executor::run`]'s operations under `policy`: [`Executor::with_tool`] with the
    /// executor's tool under this policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.tool.set_policy(policy);
        self
    }

    /// [`Executor::run`]'s tool with this [maximum wait](crate::ToolBuilder::max_wait).
    pub fn with_max_wait(mut self, max: Duration) -> Self {
        self.tool.set_max_wait(max);
        self
    }

    /// [`Executor::run`]'s tool with this [processing
    /// window](crate::ToolBuilder::processing_window).
    pub fn with_processing_window(mut self, window: Duration) -> Self {
        self.tool.set_processing_window(window);
        self
    }

    /// [`Executor::run`]'s tool with this [derived-key wait](crate::ToolBuilder::derived_key_wait).
    pub fn with_derived_key_wait(mut self, on: bool) -> Self {
        self.tool.set_derived_key_wait(on);
        self
    }

    /// The wait a caller of [`Executor::run`] asked for.
    pub(crate) fn requested_wait(&self) -> Duration {
        self.wait
    }

    /// The maximum wait of [`Executor::run`]'s tool.
    pub fn max_wait(&self) -> Duration {
        self.tool.max_wait()
    }

    /// Reads time from `clock`.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs the claim and the completion as background tasks through `spawn`, so a dropped caller
    /// cannot lose them (see "Cancellation"). Not needed on tokio: with the `tokio` feature (on by
    /// default) the executor spawns on the tokio runtime current when it starts a task. For another
    /// runtime, e.g. `executor.with_spawner(|task| { smol::spawn(task).detach(); })`.
    pub fn with_spawner(mut self, spawn: impl Fn(BackgroundTask) + Send + Sync + 'static) -> Self {
        self.spawn = Spawn::With(Arc::new(spawn));
        self
    }

    /// This executor without a spawner (neither its own nor tokio's): the claim and the completion
    /// run inline, in the caller's task. For a caller that already runs [`Executor::run`] in a task
    /// of its own that nothing cancels (the HTTP layer and the MCP wrapper spawn one per call):
    /// there the spawner's extra task per claim and per completion protects nothing more and costs
    /// a task hop each.
    pub fn without_spawner(&self) -> Self {
        Self {
            spawn: Spawn::Inline,
            ..self.clone()
        }
    }

    /// Encodes every outcome with `codec` before it is stored and decodes every stored outcome
    /// before it is replayed (encryption, redaction: see [`codec`](crate::codec)). The status, the
    /// class, the fingerprint and the record's metadata stay clear. A stored outcome that does not
    /// decode is [`Error::Decode`](crate::Error::Decode): nothing runs and nothing is replayed.
    pub fn with_codec(mut self, codec: impl OutcomeCodec) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    /// The policy of [`Executor::run`]'s tool.
    pub fn policy(&self) -> &Policy {
        self.tool.policy()
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
            id: RecordId::new(scope.clone(), key.clone()),
            token,
            number: attempt,
            kind,
            recorded: Arc::default(),
            policy: *self.tool.policy_for(key.origin()),
            codec: self.codec.clone(),
            resumed: Arc::from(Vec::new()),
            lease: attempt::Lease::new(self.clock.now() + self.tool.policy().lease()),
        })
    }
}
