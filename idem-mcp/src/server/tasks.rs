//! MCP tasks ([contract §5.3](idem_core::contract#tasks)) served from the store: a task is its
//! record. A task-augmented call claims its key before it answers, its task id names the record
//! (so the same call again gets the same id, from any replica), and `tasks/get` and
//! `tasks/cancel` read and settle the record, never a process's memory.

use std::time::{Duration, UNIX_EPOCH};

use idem_core::{
    Call, Error, ErrorAnswer, IdempotencyKey, Outcome, Record, RecordState, Refusal, Reply, Scope,
    StalePolicy, Started, Timestamp,
};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, ErrorCode,
    JsonObject, MetaObject, Task, TaskPayload,
};
use serde_json::{Value, json};

use super::record::{from_outcome, to_outcome};
use super::refusal::refuse;
use super::{IdempotentTools, ToolSettings};

mod task_id;

pub(super) use task_id::TaskIds;

/// The `_meta` entry of the result a cancelled task's record holds: `"io.idem/cancelled"`.
const CANCELLED_META_KEY: &str = "io.idem/cancelled";

impl IdempotentTools {
    /// Whether a call of a tool with `settings` is answered with a task: the server serves tasks
    /// ([`IdempotentTools::tasks`]), the tool allows them and the request declared the
    /// extension.
    pub(super) fn answers_with_task(
        &self,
        settings: &ToolSettings,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> bool {
        self.tasks.is_some()
            && settings.tool.tasks()
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks())
    }

    /// A task-augmented call: claims the key (or finds its record), starts the tool detached if
    /// the claim is won ([`Executor::start`](idem_core::Executor::start)), and answers with the
    /// task that names the record, read back from the store (so `tasks/get` resolves it before
    /// the answer leaves).
    pub(super) async fn call_as_task<F, Fut>(
        &self,
        principal: &str,
        name: &str,
        settings: &ToolSettings,
        call: Call,
        tool: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: FnOnce(idem_core::Attempt) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let (scope, key) = (call_scope(&call, principal, name)?, call.key().clone());
        match self.executor.start(&settings.tool, call, tool).await {
            Started::Running { .. } => {}
            Started::Answered(answer) => match answer.reply {
                Reply::Replayed { .. } | Reply::Executed { .. } => {}
                // The same call in flight: the same task.
                Reply::Refused {
                    refusal: Refusal::InFlight { .. },
                    ..
                } => {}
                Reply::Refused { refusal, .. } => return Err(refuse(&refusal, name)),
            },
        }
        let record = self.read(&scope, &key, name).await?.ok_or_else(|| {
            ErrorData::internal_error("the task's record is gone (expired or purged)", None)
        })?;
        let ids = self.task_ids()?;
        let detailed = task_of(&ids.seal(principal, name, &key), &record, settings, self);
        Ok(CallToolResponse::Task(CreateTaskResult::new(detailed.task)))
    }

    fn task_ids(&self) -> Result<&TaskIds, ErrorData> {
        self.tasks
            .as_deref()
            .ok_or_else(ErrorData::method_not_found::<rmcp::model::GetTaskMethod>)
    }

    /// The record a task id names within the caller's scope: `None` for an id that does not
    /// open under `principal` (another principal's, forged, or of a tool without tasks).
    fn resolve(&self, principal: &str, task_id: &str) -> Option<(String, Scope, IdempotencyKey)> {
        let (tool, key) = self.tasks.as_deref()?.open(principal, task_id)?;
        self.tools.get(&tool).filter(|s| s.tool.tasks())?;
        let scope = Scope::from_parts([principal, tool.as_str()]).ok()?;
        Some((tool, scope, key))
    }

    /// The tool, scope, key and live record `task_id` names for the caller of `context`; an id
    /// that does not open under the caller's principal, or whose record has expired, is unknown
    /// (`-32602`).
    async fn record_of(
        &self,
        task_id: &str,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(String, Scope, IdempotencyKey, Record), ErrorData> {
        let principal = self.principal_of(context).ok_or_else(|| unknown(task_id))?;
        let (tool, scope, key) = self
            .resolve(&principal, task_id)
            .ok_or_else(|| unknown(task_id))?;
        let record = self
            .read(&scope, &key, &tool)
            .await?
            .ok_or_else(|| unknown(task_id))?;
        Ok((tool, scope, key, record))
    }

    async fn read(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        tool: &str,
    ) -> Result<Option<Record>, ErrorData> {
        self.executor
            .read(scope, key)
            .await
            .map_err(|e| error_of(&e, tool))
    }

    /// Answers `tasks/get` from the store ([contract §5.3](idem_core::contract#tasks)): the task
    /// `task_id` names, if it is the caller's: `working` while its record is `processing` (with
    /// what is known of a holder whose lease ran out), `completed` with the stored result
    /// (replay-marked), `failed` with the error of an attempt that failed (the same call again
    /// runs it again), `cancelled` if it was cancelled before it ran. An id that is not the
    /// caller's, or whose record has expired, is unknown: `-32602`, as for an id never issued.
    ///
    /// Call it from the server handler's `get_task`.
    pub async fn get_task(
        &self,
        params: rmcp::model::GetTaskParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        let task_id = params.task_id;
        let (tool, _, _, record) = self.record_of(&task_id, &context).await?;
        let settings = &self.tools[&tool];
        Ok(rmcp::model::GetTaskResult::new(task_of(
            &task_id, &record, settings, self,
        )))
    }

    /// Answers `tasks/cancel` ([contract §5.3](idem_core::contract#tasks)), fenced like a
    /// release: a task whose tool is not running (its last attempt failed or was given back, or
    /// its holder's lease ran out and the stale policy takes it over) is settled as `cancelled`
    /// through a claim of its own, so the same call again gets the cancelled task and nothing
    /// runs. A task whose tool is running is not cancelled: its effect may already have happened
    /// and cannot be undone; the error says so (`-32600`, `data.type` `task-running`) and the
    /// task goes on to its result. A finished task is not changed (`-32600`, `task-finished`).
    /// Unknown ids: `-32602`.
    ///
    /// Call it from the server handler's `cancel_task`.
    pub async fn cancel_task(
        &self,
        params: rmcp::model::CancelTaskParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        let task_id = params.task_id;
        let (tool, scope, key, record) = self.record_of(&task_id, &context).await?;
        match record.state {
            RecordState::Completed => return Err(finished()),
            RecordState::Processing => {
                return Err(running(&record, &self.tools[&tool], self));
            }
            RecordState::FailedRetryable => {}
        }
        let settings = &self.tools[&tool];
        let call = Call::new(scope, key, record.fingerprint.clone()).transport("mcp");
        let answer = self
            .executor
            .settle(&settings.tool, call, cancelled_outcome())
            .await;
        match answer.reply {
            Reply::Executed { .. } => Ok(()),
            Reply::Replayed { .. } => Err(finished()),
            // Claimed by the same call again since the read.
            Reply::Refused {
                refusal: Refusal::InFlight { .. },
                ..
            } => Err(running(&record, settings, self)),
            Reply::Refused { refusal, .. } => Err(refuse(&refusal, &tool)),
        }
    }
}

/// The task of `record`, named `task_id`, as `tasks/get` reports it.
fn task_of(
    task_id: &str,
    record: &Record,
    settings: &ToolSettings,
    tools: &IdempotentTools,
) -> DetailedTask {
    let mut task = Task::new(
        task_id,
        rmcp::model::TaskStatus::Working,
        rfc3339(record.created_at),
        rfc3339(record.updated_at),
    )
    .with_ttl_ms(millis(
        record.expires_at.saturating_since(record.created_at),
    ))
    .with_poll_interval_ms(millis(settings.poll_interval));
    let payload = match (record.state, &record.outcome) {
        (RecordState::Processing, _) => {
            let now = tools.executor.clock().now();
            if record.lease_elapsed(now) {
                task = task.with_status_message(stale_message(record, settings));
            }
            TaskPayload::Working
        }
        (RecordState::Completed, Some(outcome)) if is_cancelled(outcome) => {
            task = task.with_status_message("cancelled before its tool ran");
            TaskPayload::Cancelled
        }
        (RecordState::Completed, Some(outcome)) => match from_outcome(outcome) {
            Ok(CallToolResponse::Complete(result)) => TaskPayload::Completed {
                result: object(&result),
            },
            Ok(_) => failed(ErrorData::internal_error(
                "the stored answer is not a final result",
                None,
            )),
            Err(error) => failed(error),
        },
        (RecordState::Completed, None) => failed(ErrorData::internal_error(
            "the record is completed without an outcome",
            None,
        )),
        (RecordState::FailedRetryable, outcome) => {
            task = task.with_status_message(
                "the attempt failed and did not complete; the same call again runs it again",
            );
            let error = match outcome.as_ref().map(from_outcome) {
                Some(Err(error)) => error,
                Some(Ok(CallToolResponse::Complete(result))) => ErrorData::internal_error(
                    "the tool answered with a retryable error",
                    Some(Value::Object(object(&result))),
                ),
                _ => ErrorData::internal_error(
                    "the attempt was given back before the tool finished",
                    None,
                ),
            };
            failed(error)
        }
    };
    DetailedTask::new(task, payload)
}

/// What is known of a `processing` record whose holder's lease ran out, per the stale policy.
fn stale_message(record: &Record, settings: &ToolSettings) -> String {
    let since = rfc3339(record.lease_until);
    match settings.tool.policy().stale() {
        StalePolicy::Takeover => format!(
            "attempt {} stopped renewing its lease at {since}; the same call again takes it over",
            record.attempt
        ),
        _ => format!(
            "attempt {} stopped renewing its lease at {since} after its tool started: its effect may have happened; awaiting reconciliation",
            record.attempt
        ),
    }
}

fn failed(error: ErrorData) -> TaskPayload {
    let error = match serde_json::to_value(&error) {
        Ok(Value::Object(error)) => error,
        _ => JsonObject::new(),
    };
    TaskPayload::Failed { error }
}

fn object(result: &CallToolResult) -> JsonObject {
    match serde_json::to_value(result) {
        Ok(Value::Object(result)) => result,
        _ => JsonObject::new(),
    }
}

/// The definitive outcome a cancelled task's record holds: an `isError` result marked
/// [`CANCELLED_META_KEY`], replayed to the same call again.
fn cancelled_outcome() -> Outcome {
    let mut result = CallToolResult::error(vec![ContentBlock::text(
        "The task was cancelled before its tool ran; nothing happened. Call again under a new key to run it.",
    )]);
    result
        .meta
        .get_or_insert_with(MetaObject::default)
        .0
        .insert(CANCELLED_META_KEY.to_owned(), json!(true));
    to_outcome(
        &Ok(CallToolResponse::Complete(result)),
        idem_core::OutcomeClass::Definitive,
    )
}

fn is_cancelled(outcome: &Outcome) -> bool {
    outcome.class() == idem_core::OutcomeClass::Definitive
        && outcome.body_json()["_meta"][CANCELLED_META_KEY] == json!(true)
}

fn unknown(task_id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task: {task_id}"), None)
}

/// `tasks/cancel` of a finished task.
fn finished() -> ErrorData {
    not_cancellable(
        "task-finished",
        "the task has finished; its result stands".into(),
    )
}

/// `tasks/cancel` of a task whose tool started.
fn running(record: &Record, settings: &ToolSettings, tools: &IdempotentTools) -> ErrorData {
    let message = match record.lease_elapsed(tools.executor.clock().now()) {
        false => "the task's tool is running: its effect may already have happened and cannot be undone, so the task is not cancelled; it goes on to its result".to_owned(),
        true => format!("not cancelled: {}", stale_message(record, settings)),
    };
    not_cancellable("task-running", message)
}

fn not_cancellable(kind: &str, message: String) -> ErrorData {
    ErrorData::new(
        ErrorCode::INVALID_REQUEST,
        message,
        Some(json!({"type": kind})),
    )
}

fn error_of(error: &Error, tool: &str) -> ErrorData {
    match ErrorAnswer::of(error) {
        ErrorAnswer::Refuse(refusal) => {
            tracing::warn!(%error, "a task's record could not be read");
            refuse(&refusal, tool)
        }
        ErrorAnswer::Answer(_) => ErrorData::internal_error(error.to_string(), None),
    }
}

/// The scope of a task-augmented `call` of `tool` by `principal`.
fn call_scope(call: &Call, principal: &str, tool: &str) -> Result<Scope, ErrorData> {
    let _ = call;
    Scope::from_parts([principal, tool])
        .map_err(|e| refuse(&Refusal::InvalidScope(e.to_string()), tool))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn rfc3339(at: Timestamp) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at.as_millis())).to_string()
}
