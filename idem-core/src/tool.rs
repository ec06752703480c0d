//! [`Tool`]: the settings of one protected tool, built once and checked when built
//! ([`ToolBuilder::build`]), so a bad setting never reaches a request.
//!
//! A deployment has one [`Executor`](crate::Executor) (store, clock, codec, spawner, heartbeat);
//! each of its tools has a `Tool` (its policy, processing window, maximum wait, key source and
//! window, derived-key wait, tasks); each request is a [`Call`](crate::Call) of a tool.

use std::time::Duration;

use serde_json::Value;

use crate::contract::ToolContract;
use crate::{IdempotencyKey, KeyOrigin, KeySource, Policy, PolicyError, Refusal};

/// One protected tool's settings, valid by construction: take [`Tool::default`] or build one
/// with [`Tool::builder`].
///
/// ```
/// use std::time::Duration;
/// use idem_core::{KeySource, Policy, Tool};
/// let tool = Tool::builder()
///     .policy(Policy::builder().lease(Duration::from_secs(10)).build()?)
///     .processing_window(Duration::from_secs(2))
///     .key_source(KeySource::arguments())
///     .build()?;
/// assert_eq!(tool.contract().min_client_deadline(), Duration::from_millis(2500));
/// // A key window must outlive the lease: refused when the tool is built, not on a request.
/// let bad = Tool::builder()
///     .policy(Policy::builder().lease(Duration::from_secs(10)).build()?)
///     .key_source(KeySource::arguments())
///     .key_window(Duration::from_secs(5))
///     .build();
/// assert!(bad.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    policy: Policy,
    /// `policy` with the key window as its ttl: what a derived key's record is kept under.
    derived: Policy,
    processing_window: Option<Duration>,
    max_wait: Option<Duration>,
    key_source: KeySource,
    key_window: Duration,
    derived_key_wait: bool,
    tasks: bool,
}

impl Default for Tool {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            derived: Policy::default(),
            processing_window: None,
            max_wait: None,
            key_source: KeySource::Refuse,
            key_window: KeySource::DEFAULT_WINDOW,
            derived_key_wait: true,
            tasks: false,
        }
    }
}

/// Why a [`ToolBuilder`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The key window, the ttl of a derived key's record, does not exceed the lease.
    #[error(
        "tool: the key window ({window:?}) must exceed the lease ({lease:?}); raise the window or shorten the lease"
    )]
    KeyWindowNotAboveLease {
        /// The key window given.
        window: Duration,
        /// The policy's lease.
        lease: Duration,
    },
    /// The processing window is zero.
    #[error("tool: the processing window must be at least 1 ms")]
    ZeroProcessingWindow,
    /// The policy itself was refused.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl Tool {
    /// A builder starting from the defaults.
    pub fn builder() -> ToolBuilder {
        ToolBuilder(Self::default())
    }

    /// A builder starting from this tool's settings.
    pub fn to_builder(&self) -> ToolBuilder {
        ToolBuilder(self.clone())
    }

    /// The policy (lease, ttl, cache and stale policies, size limits).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The published processing window (its p99); without one, the policy's lease.
    pub fn processing_window(&self) -> Duration {
        self.processing_window.unwrap_or(self.policy.lease())
    }

    /// The longest a repeat waits for an in-flight answer ([contract
    /// §5.2](crate::contract#waiting)); without one, the policy's lease.
    pub fn max_wait(&self) -> Duration {
        self.max_wait.unwrap_or(self.policy.lease())
    }

    /// What a call without a key gets ([contract §5.1](crate::contract#keyless)).
    pub fn key_source(&self) -> &KeySource {
        &self.key_source
    }

    /// How long a derived key's record is kept.
    pub fn key_window(&self) -> Duration {
        self.key_window
    }

    /// Whether a call under a derived key that finds its operation in flight is waited for
    /// without asking.
    pub fn derived_key_wait(&self) -> bool {
        self.derived_key_wait
    }

    /// Whether the tool answers a call from a client that declared MCP's tasks extension with a
    /// task ([contract §5.3](crate::contract#tasks)).
    pub fn tasks(&self) -> bool {
        self.tasks
    }

    /// What the tool publishes: its processing window and maximum wait, with the default store
    /// write budget ([`ToolContract::with_store_write`] changes it).
    pub fn contract(&self) -> ToolContract {
        ToolContract::new(self.processing_window()).with_max_wait(self.max_wait())
    }

    /// The key a call runs under ([contract §5.1](crate::contract#keyless)): the one it sent, else
    /// the one the tool's [`KeySource`] derives, or [`CallKey::Unprotected`]; a refusal when it
    /// has none.
    ///
    /// `arguments` are the call's (an HTTP request's JSON body): under
    /// [`KeySource::ModelArgument`] its argument is taken out of them whether or not a key was
    /// sent, so neither the fingerprint nor the tool ever sees it. `request` names the call for
    /// [`KeySource::Request`]: the session (`None` where the transport has none, which refuses)
    /// and the request id; `None` where the transport has no request ids (HTTP).
    pub fn key_of(
        &self,
        sent: Option<IdempotencyKey>,
        arguments: &mut Value,
        request: Option<(Option<&str>, &str)>,
    ) -> Result<CallKey, Refusal> {
        let model_value = match &self.key_source {
            KeySource::ModelArgument(name) => {
                arguments.as_object_mut().and_then(|a| a.remove(name))
            }
            _ => None,
        };
        if let Some(key) = sent {
            return Ok(CallKey::Key(key));
        }
        let key = match &self.key_source {
            KeySource::Unprotected => return Ok(CallKey::Unprotected),
            KeySource::Refuse => return Err(Refusal::KeyRequired),
            KeySource::Arguments(pointers) => {
                IdempotencyKey::from_arguments(&crate::key_source::select(pointers, arguments))
                    .map_err(|e| Refusal::InvalidBody(e.to_string()))?
            }
            KeySource::ModelArgument(name) => match model_value {
                Some(Value::String(value)) => IdempotencyKey::from_model_argument(&value)
                    .map_err(|e| Refusal::InvalidKey(format!("{e} (in the argument {name})")))?,
                Some(_) => {
                    let why =
                        format!("invalid idempotency key: the argument {name} must be a string");
                    return Err(Refusal::InvalidKey(why));
                }
                None => return Err(Refusal::KeyRequired),
            },
            KeySource::Request => match request {
                Some((Some(session), id)) => IdempotencyKey::from_request(session, id),
                // Stateless transports: request ids are the client's own, not unique per server.
                _ => return Err(Refusal::KeyRequired),
            },
        };
        Ok(CallKey::Key(key))
    }

    /// For the executor's own tool ([`Executor::with_policy`](crate::Executor::with_policy) and
    /// its siblings): this tool under `policy`; a key window that no longer fits keeps the policy.
    pub(crate) fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.derived = policy
            .to_builder()
            .ttl(self.key_window)
            .build()
            .unwrap_or(policy);
        if matches!(self.key_source, KeySource::Refuse | KeySource::Unprotected) {
            self.derived = policy;
        }
    }

    pub(crate) fn set_max_wait(&mut self, max: Duration) {
        self.max_wait = Some(max);
    }

    pub(crate) fn set_processing_window(&mut self, window: Duration) {
        self.processing_window = Some(window);
    }

    pub(crate) fn set_derived_key_wait(&mut self, on: bool) {
        self.derived_key_wait = on;
    }

    /// The policy a record under a key from `origin` is kept under: a derived key's for the key
    /// window.
    pub(crate) fn policy_for(&self, origin: KeyOrigin) -> &Policy {
        match origin {
            KeyOrigin::Sent => &self.policy,
            _ => &self.derived,
        }
    }

    /// The bound of the wait of a call under a key from `origin` that asked for `wait`: the least
    /// of it and the maximum wait; for a derived key that asked for none, the maximum wait unless
    /// the tool turned that off.
    pub(crate) fn wait_bound(&self, origin: KeyOrigin, wait: Duration) -> Duration {
        if wait.is_zero() && origin != KeyOrigin::Sent && self.derived_key_wait {
            self.max_wait()
        } else {
            wait.min(self.max_wait())
        }
    }
}

/// The key a call runs under ([`Tool::key_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallKey {
    /// This key, sent or derived (its [`KeyOrigin`] says which).
    Key(IdempotencyKey),
    /// No key, and the tool's key source lets the call run unprotected.
    Unprotected,
}

/// Builds a [`Tool`]; [`build`](Self::build) checks the settings together.
#[derive(Debug, Clone)]
pub struct ToolBuilder(Tool);

impl ToolBuilder {
    /// The policy (default [`Policy::default`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.0.policy = policy;
        self
    }

    /// The published processing window (its p99): an in-flight answer tells the caller to ask
    /// again when what is left of it has passed, instead of the whole remaining lease (default:
    /// the lease).
    pub fn processing_window(mut self, window: Duration) -> Self {
        self.0.processing_window = Some(window);
        self
    }

    /// The longest a repeat waits for an in-flight answer (default: the lease).
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.0.max_wait = Some(max);
        self
    }

    /// What a call without a key gets (default [`KeySource::Refuse`]).
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.0.key_source = source;
        self
    }

    /// How long a derived key's record is kept: the same call within it replays (default
    /// [`KeySource::DEFAULT_WINDOW`], 1 hour). Must exceed the lease when the key source derives
    /// keys.
    pub fn key_window(mut self, window: Duration) -> Self {
        self.0.key_window = window;
        self
    }

    /// Whether a call under a derived key that finds its operation in flight is waited for, up
    /// to the maximum wait (on by default: its client cannot ask to wait, [contract
    /// §5.1](crate::contract#keyless)). `false`: it is answered in flight at once.
    pub fn derived_key_wait(mut self, on: bool) -> Self {
        self.0.derived_key_wait = on;
        self
    }

    /// Whether the tool answers a call from a client that declared MCP's tasks extension with a
    /// task (off by default).
    pub fn tasks(mut self, on: bool) -> Self {
        self.0.tasks = on;
        self
    }

    /// The tool, or why its settings do not fit together.
    pub fn build(self) -> Result<Tool, ToolError> {
        let mut tool = self.0;
        let lease = tool.policy.lease();
        // A window longer than the lease is allowed: a heartbeat renews a working holder's lease.
        if tool.processing_window.is_some_and(|w| w.as_millis() == 0) {
            return Err(ToolError::ZeroProcessingWindow);
        }
        tool.derived = match tool.key_source {
            KeySource::Arguments(_) | KeySource::ModelArgument(_) | KeySource::Request => {
                let window = tool.key_window;
                match tool.policy.to_builder().ttl(window).build() {
                    Ok(policy) => policy,
                    Err(PolicyError::TtlNotAboveLease { .. }) => {
                        return Err(ToolError::KeyWindowNotAboveLease { window, lease });
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            _ => tool.policy,
        };
        Ok(tool)
    }
}

#[cfg(test)]
mod tests;
