//! The agent side: call a side-effecting tool of an rmcp client's peer with one key on every
//! attempt ([contract §6](idem_core::contract#client-side), client side).

use std::time::Duration;

use idem_core::IdempotencyKey;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, RequestMetaObject, Tool,
};
use rmcp::service::{Peer, ServiceError};
use serde_json::Value;
use tokio::time::Instant;

use crate::key::META_KEY;
use crate::server::{IN_FLIGHT, STORE_UNAVAILABLE, TOOL_META_KEY, is_replay};
use crate::wait::WAIT_META_KEY;

pub use idem_core::retry::{DeadlineExceeded, RetryPolicy, ShortAttempt};

/// Why an idempotent call produced no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The attempt timeout is below the tool's published minimum client deadline.
    #[error(transparent)]
    DeadlineBelowMinimum(#[from] ShortAttempt),
    /// The overall deadline passed without a result.
    #[error(transparent)]
    DeadlineExceeded(#[from] DeadlineExceeded),
    /// The server refused the call in a way a retry with the same key cannot fix (invalid or
    /// missing key, fingerprint mismatch, unknown tool…).
    #[error("the server refused the call: {0}")]
    Refused(ErrorData),
    /// The connection is closed: reconnect and call again with the same key.
    #[error("the connection to the server is closed")]
    Closed,
    /// The server answered with something other than a final result (an MRTR round or a task).
    #[error("the server answered with a non-final result")]
    NotFinal,
}

/// A result and how it was obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct CallAnswer {
    /// The tool's result.
    pub result: CallToolResult,
    /// Whether the server replayed an earlier execution's result.
    pub replayed: bool,
    /// Attempts made (1 if the first answered).
    pub attempts: u32,
    /// Attempts answered "in flight".
    pub in_flight: u32,
    /// Attempts that timed out or failed in transport.
    pub failed_attempts: u32,
}

/// The minimum client retry deadline a tool publishes in its `_meta` (see
/// [`crate::server::TOOL_META_KEY`]).
pub fn min_client_deadline(tool: &Tool) -> Option<Duration> {
    tool.meta
        .as_ref()?
        .0
        .get(TOOL_META_KEY)?
        .get("minClientDeadlineMs")?
        .as_u64()
        .map(Duration::from_millis)
}

/// Calls side-effecting tools through an rmcp client [`Peer`], one key per logical operation:
/// the key goes in `params._meta["io.idem/idempotencyKey"]` (rmcp's typed params have no
/// `idempotencyKey` field), is never changed between attempts, and attempts that time out, fail
/// in transport, or are answered "in flight" or "store unavailable" are retried with exponential
/// backoff and jitter (waiting at least the server's `retryAfterMs`) until the overall deadline.
///
/// ```no_run
/// # async fn demo(peer: rmcp::service::Peer<rmcp::RoleClient>) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::IdempotencyKey;
/// use idem_mcp::client::{IdempotentCaller, RetryPolicy};
/// let caller = IdempotentCaller::new(peer, RetryPolicy::default());
/// // From the orchestrator's durable step, never from the model.
/// let key = IdempotencyKey::for_step("wf-8812", "step-3", "create_ticket")?;
/// let args = serde_json::json!({"title": "Printer on fire", "account_id": "A-7"});
/// let answer = caller.call("create_ticket", args.as_object().cloned(), &key, None).await?;
/// println!("replayed: {}", answer.replayed);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotentCaller {
    peer: Peer<RoleClient>,
    policy: RetryPolicy,
    wait: bool,
}

impl IdempotentCaller {
    /// A caller through `peer` (e.g. `running_service.peer().clone()`).
    pub fn new(peer: Peer<RoleClient>, policy: RetryPolicy) -> Self {
        Self {
            peer,
            policy,
            wait: true,
        }
    }

    /// The same caller without `_meta["io.idem/wait"]`: an attempt that finds the operation in
    /// flight is answered "in flight" at once and retried after `retryAfterMs`. By default each
    /// attempt asks the tool to wait for the in-flight result within the attempt's own timeout
    /// (less a 500 ms margin, [contract §5.2](idem_core::contract#waiting)).
    pub fn without_wait(mut self) -> Self {
        self.wait = false;
        self
    }

    /// The key of step `step_id` of workflow run `workflow_run_id` calling `tool`
    /// ([`IdempotencyKey::for_step`]).
    pub fn step_key(
        workflow_run_id: &str,
        step_id: &str,
        tool: &str,
    ) -> Result<IdempotencyKey, idem_core::KeyError> {
        IdempotencyKey::for_step(workflow_run_id, step_id, tool)
    }

    /// The minimum client retry deadline `tool` publishes, read from the server's tool listing
    /// (`tools/list`); `None` if the tool is not listed or publishes none.
    pub async fn published_minimum(&self, tool: &str) -> Result<Option<Duration>, ServiceError> {
        let tools = self.peer.list_all_tools().await?;
        Ok(tools
            .iter()
            .find(|t| t.name == tool)
            .and_then(min_client_deadline))
    }

    /// Calls `tool` with `arguments` under `key`, retrying as the policy says. With
    /// `min_client_deadline` (the tool's published minimum, see [`min_client_deadline`]), refuses
    /// a policy whose attempt timeout is shorter, unless `allow_short_attempts`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Option<serde_json::Map<String, Value>>,
        key: &IdempotencyKey,
        min_client_deadline: Option<Duration>,
    ) -> Result<CallAnswer, CallError> {
        let policy = self.policy;
        policy.check_minimum(min_client_deadline)?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let mut meta = RequestMetaObject::new();
        meta.0
            .0
            .insert(META_KEY.to_owned(), Value::String(key.as_str().to_owned()));
        params.meta = Some(meta);

        let deadline = Instant::now() + policy.overall_deadline;
        let (mut attempts, mut in_flight, mut failed) = (0u32, 0u32, 0u32);
        let mut backoff = policy.backoff();
        loop {
            let now = Instant::now();
            if now >= deadline {
                let last = "deadline reached".into();
                return Err(DeadlineExceeded { attempts, last }.into());
            }
            attempts += 1;
            let timeout = policy.attempt_timeout.min(deadline - now);
            if let (true, Some(meta)) = (self.wait, params.meta.as_mut()) {
                match crate::wait::wait_within(timeout) {
                    Some(wait) => meta.0.0.insert(WAIT_META_KEY.to_owned(), wait),
                    None => meta.0.0.remove(WAIT_META_KEY),
                };
            }
            // Dropping the attempt on timeout sends `notifications/cancelled`; a server using
            // `IdempotentTools` finishes the tool anyway and records its result for the retry.
            let sent =
                tokio::time::timeout(timeout, self.peer.call_tool_once(params.clone())).await;
            let (retry_after, last) = match sent {
                Ok(Ok(CallToolResponse::Complete(result))) => {
                    return Ok(CallAnswer {
                        replayed: is_replay(&result),
                        result,
                        attempts,
                        in_flight,
                        failed_attempts: failed,
                    });
                }
                Ok(Ok(_)) => return Err(CallError::NotFinal),
                Ok(Err(ServiceError::McpError(e))) if e.code == IN_FLIGHT => {
                    in_flight += 1;
                    let ms = e
                        .data
                        .as_ref()
                        .and_then(|d| d.get("retryAfterMs"))
                        .and_then(Value::as_u64);
                    (ms.map(Duration::from_millis), e.message.to_string())
                }
                Ok(Err(ServiceError::McpError(e))) if e.code == STORE_UNAVAILABLE => {
                    (None, e.message.to_string())
                }
                Ok(Err(ServiceError::McpError(e))) => return Err(CallError::Refused(e)),
                Ok(Err(ServiceError::TransportClosed)) => return Err(CallError::Closed),
                Ok(Err(e)) => {
                    failed += 1;
                    (None, e.to_string())
                }
                Err(_) => {
                    failed += 1;
                    (None, format!("attempt timed out after {timeout:?}"))
                }
            };
            let wait = backoff.next_wait(retry_after);
            if Instant::now() + wait >= deadline {
                return Err(DeadlineExceeded { attempts, last }.into());
            }
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_keys_come_from_the_durable_step() {
        let key = IdempotentCaller::step_key("wf-1", "step-3", "create_ticket").unwrap();
        assert_eq!(key.as_str(), "wf-1:step-3:create_ticket");
    }
}
