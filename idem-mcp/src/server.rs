//! [`IdempotentTools`]: the server side, used from a [`ServerHandler`](rmcp::ServerHandler)'s
//! `call_tool`, `list_tools` and `get_info`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::metrics::count_refusal;
use idem_core::{
    Error, Execution, Executor, Fingerprint, KeyStore, Outcome, OutcomeClass, Policy, Scope,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, JsonObject, MetaObject,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use crate::key::{self, KeyRefusal};

/// JSON-RPC error code: the key was already used with other arguments ([contract §4](idem_core::contract#refusals),
/// `FingerprintMismatch`). In the implementation-defined server-error range.
pub const FINGERPRINT_MISMATCH: ErrorCode = ErrorCode(-32090);
/// JSON-RPC error code: another call with this key is still running; `data.retryAfterMs` says
/// when to ask again ([contract §4](idem_core::contract#refusals), `InFlight`).
pub const IN_FLIGHT: ErrorCode = ErrorCode(-32091);
/// JSON-RPC error code: the idempotency store is unavailable; nothing ran, retry later
/// ([contract §4](idem_core::contract#refusals), `StoreUnavailable`).
pub const STORE_UNAVAILABLE: ErrorCode = ErrorCode(-32092);
/// JSON-RPC error code: a side-effecting tool was called without a principal and the server has
/// not opted into one shared scope ([`IdempotentTools::allow_anonymous`]); nothing was claimed and
/// the tool did not run ([contract §1](idem_core::contract#words), scope).
pub const UNAUTHENTICATED: ErrorCode = ErrorCode(-32093);

/// The `_meta` entry of a result that says whether it is a replay: `"io.idem/replayed"`.
pub const REPLAYED_META_KEY: &str = "io.idem/replayed";
/// The `_meta` entry of a replayed result whose original was too large to keep: the problem
/// document of type [`idem_core::OUTCOME_NOT_KEPT`] (the tool ran; its result was not kept).
pub const NOT_KEPT_META_KEY: &str = "io.idem/outcomeNotKept";
/// The tool `_meta` entry with the machine-readable contract (`processingWindowMs`,
/// `minClientDeadlineMs`, `keyRequired`): `"io.idem/idempotency"`.
pub const TOOL_META_KEY: &str = "io.idem/idempotency";
/// The capability advertised in `capabilities.experimental` (rmcp's `ToolsCapability` has no
/// slot for the draft's `tools.idempotency`): `"tools.idempotency"`.
pub const CAPABILITY: &str = "tools.idempotency";

/// What a side-effecting tool does when called without a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Refuse with `-32602` ([contract §4](idem_core::contract#refusals) `KeyRequired`); the tool does not run. The default.
    #[default]
    Refuse,
    /// Run the tool without protection and log a warning: a retry may repeat the effect.
    RunUnprotected,
}

/// How one side-effecting tool is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSettings {
    /// What happens to a call without a key.
    pub missing_key: MissingKey,
    /// The tool's published processing window (its p99), shown in its description.
    pub processing_window: Duration,
    /// The class of a result with `isError: true` (default definitive: a business answer).
    pub tool_error: OutcomeClass,
    /// The `destructiveHint` annotation; `None` keeps what the tool declared.
    pub destructive: Option<bool>,
}

impl Default for ToolSettings {
    fn default() -> Self {
        Self {
            missing_key: MissingKey::Refuse,
            processing_window: Duration::from_secs(30),
            tool_error: OutcomeClass::Definitive,
            destructive: None,
        }
    }
}

impl ToolSettings {
    /// The default settings with `processing_window`.
    pub fn window(processing_window: Duration) -> Self {
        Self {
            processing_window,
            ..Self::default()
        }
    }

    /// Sets [`ToolSettings::missing_key`].
    pub fn missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// Sets [`ToolSettings::tool_error`].
    pub fn tool_error(mut self, class: OutcomeClass) -> Self {
        self.tool_error = class;
        self
    }

    /// Sets [`ToolSettings::destructive`].
    pub fn destructive(mut self, destructive: bool) -> Self {
        self.destructive = Some(destructive);
        self
    }
}

/// The authenticated principal of a request, put in the request's extensions by the server's
/// authentication (for streamable HTTP: an axum/tower layer inserting it into the HTTP request's
/// extensions, which rmcp hands on inside `http::request::Parts`). [`IdempotentTools`] scopes
/// keys by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

type PrincipalFn = dyn Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync;

/// The principal [`IdempotentTools`] finds by default: a [`Principal`] in the request context's
/// extensions, or in those of the HTTP request (`http::request::Parts`).
pub fn default_principal(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<Principal>()
        .or_else(|| {
            context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Principal>())
        })
        .map(|p| p.0.clone())
}

/// Makes the side-effecting tools of an rmcp server exactly-once per idempotency key.
///
/// Register each side-effecting tool with [`IdempotentTools::tool`], then from the server's
/// handler call:
/// - [`IdempotentTools::call`] in `call_tool`, with the tool's own dispatch as the last argument;
/// - [`IdempotentTools::describe`] on the tools listed by `list_tools`;
/// - [`IdempotentTools::advertise`] on the `get_info` answer.
///
/// For a registered tool, [`IdempotentTools::call`]:
/// 1. reads the key ([`crate::key`]: `params.idempotencyKey`, then
///    `params._meta["io.idem/idempotencyKey"]`), refusing an invalid one with `-32602`; without a
///    key it follows the tool's [`MissingKey`];
/// 2. scopes the record by the principal (see [`IdempotentTools::principal_with`]; the default
///    looks for a [`Principal`]) and the tool name. A call without a principal is refused with
///    [`UNAUTHENTICATED`] (nothing claimed, the tool not run), unless the server opted into one
///    shared scope with [`IdempotentTools::allow_anonymous`];
/// 3. fingerprints the tool name and the canonical arguments;
/// 4. runs the tool through the [`Executor`] in a spawned task (a client that goes away cannot
///    cancel it halfway; its retry gets the recorded answer), with the
///    [`Attempt`](idem_core::Attempt) in the request context's extensions (so a tool can complete
///    the record in its own transaction and call `mark_recorded`);
/// 5. records the `CallToolResult` as the outcome: a success and an `isError: true` result are
///    definitive (the latter per `ToolSettings::tool_error`); an `Err` from the tool (an
///    internal or transport failure) is retryable;
/// 6. answers with the result marked `"io.idem/replayed": false` in its `_meta`; a repeat gets
///    the stored result marked `true`. Same key with other arguments: error
///    [`FINGERPRINT_MISMATCH`]; a repeat while the first runs: [`IN_FLIGHT`] with
///    `data.retryAfterMs`; a store that is down: [`STORE_UNAVAILABLE`].
///
/// Other tools are passed through untouched.
#[derive(Clone)]
pub struct IdempotentTools {
    executor: Executor,
    tools: Arc<HashMap<String, ToolSettings>>,
    principal: Arc<PrincipalFn>,
    anonymous: Option<String>,
    store_write: Duration,
}

impl fmt::Debug for IdempotentTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTools")
            .field("executor", &self.executor)
            .field("tools", &self.tools)
            .field("anonymous", &self.anonymous)
            .field("store_write", &self.store_write)
            .finish_non_exhaustive()
    }
}

/// What the store write costs at most by default, added to a tool's processing window for the
/// minimum client retry deadline: 500 ms.
pub const DEFAULT_STORE_WRITE: Duration = Duration::from_millis(500);

impl IdempotentTools {
    /// Protects tools through `executor`. Give it a spawner
    /// (`executor.with_spawner(|task| { tokio::spawn(task); })`) so that claims and completions
    /// survive a dropped request, and a lease at least the longest minimum client deadline.
    pub fn new(executor: Executor) -> Self {
        Self {
            executor,
            tools: Arc::new(HashMap::new()),
            principal: Arc::new(default_principal),
            anonymous: None,
            store_write: DEFAULT_STORE_WRITE,
        }
    }

    /// An executor over `store` with `policy`, the system clock and a tokio spawner.
    pub fn with_store(store: impl KeyStore, policy: Policy) -> Self {
        Self::new(
            Executor::new(store)
                .with_policy(policy)
                .with_spawner(|task| {
                    tokio::spawn(task);
                }),
        )
    }

    /// Marks tool `name` side-effecting, protected with `settings`.
    pub fn tool(mut self, name: impl Into<String>, settings: ToolSettings) -> Self {
        Arc::make_mut(&mut self.tools).insert(name.into(), settings);
        self
    }

    /// Names the principal of a request (`None`: no principal, see
    /// [`IdempotentTools::allow_anonymous`]). The default is [`default_principal`].
    pub fn principal_with(
        mut self,
        principal: impl Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.principal = Arc::new(principal);
        self
    }

    /// Opts into one shared scope: requests that carry no principal are scoped as `principal`.
    ///
    /// Without it (the default) a side-effecting call without a principal is refused with
    /// [`UNAUTHENTICATED`]: on streamable HTTP without an authentication layer, one shared scope
    /// would let every client replay another's result or probe its keys. Opt in only where all
    /// such callers may share results: a stdio server (one client per process), or a server
    /// whose every caller is one trusted agent.
    pub fn allow_anonymous(mut self, principal: impl Into<String>) -> Self {
        self.anonymous = Some(principal.into());
        self
    }

    /// The store write budget added to each processing window (default [`DEFAULT_STORE_WRITE`]).
    pub fn store_write(mut self, budget: Duration) -> Self {
        self.store_write = budget;
        self
    }

    /// The executor.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// The settings of `tool`, if it is side-effecting.
    pub fn settings(&self, tool: &str) -> Option<&ToolSettings> {
        self.tools.get(tool)
    }

    /// The minimum client retry deadline of `tool`: processing window + store write ([contract §5](idem_core::contract#http)).
    pub fn min_client_deadline(&self, tool: &str) -> Option<Duration> {
        self.settings(tool)
            .map(|s| s.processing_window + self.store_write)
    }

    /// Adds the `tools.idempotency` capability (in `capabilities.experimental`) to `info`.
    pub fn advertise(&self, mut info: ServerConfig) -> ServerConfig {
        let mut names: Vec<&String> = self.tools.keys().collect();
        names.sort();
        let mut settings = JsonObject::new();
        settings.insert("keyField".into(), json!(key::PARAMS_FIELD));
        settings.insert("metaKey".into(), json!(key::META_KEY));
        settings.insert("tools".into(), json!(names));
        info.capabilities
            .experimental
            .get_or_insert_with(Default::default)
            .insert(CAPABILITY.to_owned(), settings);
        info
    }

    /// Describes the protection of each side-effecting tool in `tools`: its description gains the
    /// processing window and the minimum client retry deadline, its `_meta` gains
    /// [`TOOL_META_KEY`], and its annotations are set honestly: `readOnlyHint: false`,
    /// `idempotentHint: true` only when every accepted call carries a key
    /// ([`MissingKey::Refuse`]), `destructiveHint` per `ToolSettings::destructive`.
    pub fn describe(&self, tools: Vec<Tool>) -> Vec<Tool> {
        tools.into_iter().map(|t| self.describe_tool(t)).collect()
    }

    fn describe_tool(&self, mut tool: Tool) -> Tool {
        let Some(settings) = self.tools.get(tool.name.as_ref()) else {
            return tool;
        };
        let window = settings.processing_window.as_millis() as u64;
        let deadline = (settings.processing_window + self.store_write).as_millis() as u64;
        let without = match settings.missing_key {
            MissingKey::Refuse => "a call without a key is refused",
            MissingKey::RunUnprotected => {
                "a call without a key runs unprotected and a retry of it may repeat the effect"
            }
        };
        let note = format!(
            "Side-effecting. Send an idempotency key made from your durable workflow step \
             (params.idempotencyKey, or params._meta[\"{meta}\"]) and reuse it on every retry: \
             with a key the call runs once and a repeat returns the first result; {without}. \
             Processing window: {window} ms; minimum client retry deadline: {deadline} ms — an \
             attempt shorter than that is cut off while the tool is still working.",
            meta = key::META_KEY,
        );
        tool.description = Some(match tool.description.take() {
            Some(d) if !d.is_empty() => format!("{d}\n\n{note}").into(),
            _ => note.into(),
        });
        let mut annotations = tool.annotations.take().unwrap_or_default();
        annotations = with_hints(
            annotations,
            settings.missing_key == MissingKey::Refuse,
            settings.destructive,
        );
        tool.annotations = Some(annotations);
        let meta = tool.meta.get_or_insert_with(MetaObject::default);
        meta.0.insert(
            TOOL_META_KEY.to_owned(),
            json!({
                "processingWindowMs": window,
                "minClientDeadlineMs": deadline,
                "keyRequired": settings.missing_key == MissingKey::Refuse,
            }),
        );
        tool
    }

    /// The outcome [`IdempotentTools::call`] records for `result` of `tool`, for a tool that
    /// completes its record in the same transaction as its effect (e.g. `SqliteStore::complete_in`)
    /// and then calls [`Attempt::mark_recorded`](idem_core::Attempt::mark_recorded): a replay then
    /// returns `result`.
    pub fn outcome_for(&self, tool: &str, result: &CallToolResult) -> Outcome {
        let class = self
            .settings(tool)
            .map_or(OutcomeClass::Definitive, |s| s.tool_error);
        to_outcome(&Ok(CallToolResponse::Complete(result.clone())), class)
    }

    /// Runs the `tools/call` `params` through `tool` (the server's own dispatch, e.g. its
    /// `ToolRouter`), exactly once per key for side-effecting tools; see the type's docs.
    pub async fn call<F, Fut>(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        tool: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: FnOnce(CallToolRequestParams, RequestContext<RoleServer>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'static,
    {
        let name = params.name.to_string();
        let Some(settings) = self.tools.get(&name).copied() else {
            return tool(params, context).await;
        };
        // Before anything else: without a principal (and no opt-in) nothing runs, keyed or not.
        let Some(principal) = (self.principal)(&context).or_else(|| self.anonymous.clone()) else {
            count_refusal("mcp", "unauthenticated");
            return Err(unauthenticated(&name));
        };
        let key = match key::key_of(&params, &context.meta.0.0) {
            Ok(Some(key)) => key,
            Ok(None) => match settings.missing_key {
                MissingKey::Refuse => {
                    count_refusal("mcp", "key-required");
                    return Err(key_required(&name));
                }
                MissingKey::RunUnprotected => {
                    idem_core::metrics::count_unprotected("mcp");
                    tracing::warn!(tool = %name, "side-effecting tool called without an idempotency key; running it unprotected");
                    return tool(params, context).await;
                }
            },
            Err(refusal) => {
                count_refusal("mcp", "invalid-key");
                return Err(invalid_key(&refusal));
            }
        };
        let scope = Scope::from_parts([principal.as_str(), name.as_str()]).map_err(|e| {
            count_refusal("mcp", "invalid-scope");
            ErrorData::invalid_params(format!("the idempotency scope cannot be built: {e}"), None)
        })?;
        let arguments = Value::Object(params.arguments.clone().unwrap_or_default());
        let fingerprint = Fingerprint::of(&name, &arguments).map_err(|e| {
            count_refusal("mcp", "invalid-body");
            ErrorData::invalid_params(format!("the arguments cannot be fingerprinted: {e}"), None)
        })?;

        // The live answer of this call's own run, returned as it is (a replay is decoded from
        // the record instead).
        let live: Arc<Mutex<Option<Result<CallToolResponse, ErrorData>>>> = Default::default();
        let slot = live.clone();
        let executor = self.executor.clone();
        // Detached: rmcp drops this request's future when the client cancels or goes away; the
        // tool and its completion must not stop halfway.
        let task = tokio::spawn(async move {
            executor
                .run(&scope, &key, &fingerprint, move |attempt| async move {
                    let mut context = context;
                    context.extensions.insert(attempt);
                    let answer = tool(params, context).await;
                    let outcome = to_outcome(&answer, settings.tool_error);
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(answer);
                    outcome
                })
                .await
        });
        let result = match task.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(tool = %name, error = %e, "the tool's task failed; its record is left to the lease");
                return Err(ErrorData::internal_error(
                    "the tool failed without an answer",
                    None,
                ));
            }
        };
        let take_live = || live.lock().unwrap_or_else(|p| p.into_inner()).take();
        match result {
            Ok(Execution::Replayed { outcome }) => from_outcome(&outcome),
            Ok(Execution::Executed { outcome, .. }) => {
                live_or(take_live(), &outcome).map(|r| mark(r, false))
            }
            // The tool ran, but its answer could not be recorded as this attempt's: the caller
            // still gets it (the effect happened). Fenced: the newer holder's answer stands;
            // too large: the record holds "ran, not kept" for retries; not recorded or not
            // encoded by the codec: the record is left to the lease.
            Err(Error::Fenced { outcome })
            | Err(Error::OutcomeTooLarge { outcome, .. })
            | Err(Error::NotRecorded { outcome, .. })
            | Err(Error::Encode { outcome, .. }) => {
                live_or(take_live(), &outcome).map(|r| mark(r, false))
            }
            Err(Error::InFlight { retry_after, stale }) => Err(in_flight(retry_after, stale)),
            Err(Error::FingerprintMismatch) => Err({
                count_refusal("mcp", "fingerprint-mismatch");
                ErrorData::new(
                    FINGERPRINT_MISMATCH,
                    format!(
                        "idempotency key already used for a call of {name} with other arguments; nothing ran: use a new key for a new operation"
                    ),
                    Some(json!({"type": "urn:idem:problem:fingerprint-mismatch"})),
                )
            }),
            Err(Error::Store(e)) => {
                tracing::warn!(error = %e, "store failed before the tool ran");
                Err(ErrorData::new(
                    STORE_UNAVAILABLE,
                    "the idempotency store is unavailable; nothing ran, retry later with the same key",
                    Some(json!({"type": "urn:idem:problem:store-unavailable"})),
                ))
            }
            Err(other) => {
                tracing::error!(error = %other, "unexpected executor error");
                Err(ErrorData::internal_error(other.to_string(), None))
            }
        }
    }
}

fn with_hints(
    mut annotations: ToolAnnotations,
    idempotent: bool,
    destructive: Option<bool>,
) -> ToolAnnotations {
    annotations.read_only_hint = Some(false);
    annotations.idempotent_hint = Some(idempotent);
    if destructive.is_some() {
        annotations.destructive_hint = destructive;
    }
    annotations
}

/// The [contract §4](idem_core::contract#refusals) `KeyRequired` refusal.
fn key_required(tool: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "{tool} is side-effecting and needs an idempotency key: send params.idempotencyKey or params._meta[\"{}\"], made from your durable workflow step and the same on every retry",
            key::META_KEY
        ),
        Some(json!({"type": "urn:idem:problem:key-required"})),
    )
}

/// The refusal of a call without a principal ([contract §1](idem_core::contract#words), scope).
fn unauthenticated(tool: &str) -> ErrorData {
    ErrorData::new(
        UNAUTHENTICATED,
        format!(
            "{tool} is side-effecting and this request carries no principal: authenticate (the server scopes idempotency keys by principal); nothing ran"
        ),
        Some(json!({"type": "urn:idem:problem:unauthenticated"})),
    )
}

/// The [contract §4](idem_core::contract#refusals) `InvalidKey` refusal.
fn invalid_key(refusal: &KeyRefusal) -> ErrorData {
    ErrorData::invalid_params(
        refusal.to_string(),
        Some(json!({"type": "urn:idem:problem:invalid-key"})),
    )
}

fn in_flight(retry_after: Duration, stale: bool) -> ErrorData {
    let ms = retry_after.as_millis().max(1) as u64;
    ErrorData::new(
        IN_FLIGHT,
        format!(
            "a call with this idempotency key is still running; retry with the same key after {ms} ms"
        ),
        Some(json!({
            "type": "urn:idem:problem:in-flight",
            "retryAfterMs": ms,
            "retryAfterSeconds": retry_after.as_secs_f64().ceil().max(1.0) as u64,
            "stale": stale,
        })),
    )
}

// Stored outcome statuses: the tool's result (200), its `isError` result (422), an error the
// tool returned instead of a result (500), a non-final answer that cannot be replayed (202).
const STATUS_OK: u16 = 200;
const STATUS_TOOL_ERROR: u16 = 422;
const STATUS_FAILED: u16 = 500;
const STATUS_NOT_FINAL: u16 = 202;

fn to_outcome(answer: &Result<CallToolResponse, ErrorData>, tool_error: OutcomeClass) -> Outcome {
    let built = match answer {
        Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
            Outcome::new(STATUS_TOOL_ERROR, result, tool_error)
        }
        Ok(CallToolResponse::Complete(result)) => {
            Outcome::new(STATUS_OK, result, OutcomeClass::Definitive)
        }
        // An MRTR `input_required` or a task is not the call's answer yet: nothing to replay.
        Ok(_) => Outcome::new(
            STATUS_NOT_FINAL,
            &json!({"error": "the tool answered with a non-final result"}),
            OutcomeClass::Retryable,
        ),
        Err(e) => Outcome::new(STATUS_FAILED, &json!({"error": e}), OutcomeClass::Retryable),
    };
    built.unwrap_or_else(|_| {
        Outcome::from_json_text(
            STATUS_FAILED,
            r#"{"error":{"code":-32603,"message":"the tool's answer could not be serialised"}}"#,
            OutcomeClass::Retryable,
        )
        .expect("a constant JSON text")
    })
}

/// A stored outcome as the answer of a replay.
fn from_outcome(outcome: &Outcome) -> Result<CallToolResponse, ErrorData> {
    let corrupt = |e: serde_json::Error| {
        ErrorData::internal_error(format!("the stored result cannot be read: {e}"), None)
    };
    if outcome.is_not_kept() {
        return not_kept(outcome);
    }
    match outcome.status() {
        STATUS_OK | STATUS_TOOL_ERROR => {
            let result: CallToolResult = serde_json::from_str(outcome.body()).map_err(corrupt)?;
            Ok(mark(CallToolResponse::Complete(result), true))
        }
        STATUS_FAILED => {
            #[derive(serde::Deserialize)]
            struct Failed {
                error: ErrorData,
            }
            let failed: Failed = serde_json::from_str(outcome.body()).map_err(corrupt)?;
            Err(failed.error)
        }
        _ => Err(ErrorData::internal_error(
            "the stored answer is not a final result",
            None,
        )),
    }
}

/// The replay of a call whose result was too large to keep ([contract §2](idem_core::contract#states)): the tool ran and this is
/// the final answer. A result (`isError` as the original's) whose text says so, with the
/// problem document under `_meta["io.idem/outcomeNotKept"]`; an error the tool returned stays an
/// error, with the problem as its `data`.
fn not_kept(outcome: &Outcome) -> Result<CallToolResponse, ErrorData> {
    let problem = outcome.body_json();
    let detail = problem["detail"]
        .as_str()
        .unwrap_or("the tool ran, but its result was too large to keep")
        .to_owned();
    let text = format!(
        "The tool ran; its result was not kept by the idempotency store, so it cannot be replayed. Do not call it again under a new key: {detail}"
    );
    match outcome.status() {
        STATUS_OK | STATUS_TOOL_ERROR => {
            let mut result = if outcome.status() == STATUS_OK {
                CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)])
            } else {
                CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)])
            };
            result
                .meta
                .get_or_insert_with(MetaObject::default)
                .0
                .insert(NOT_KEPT_META_KEY.to_owned(), problem);
            Ok(mark(CallToolResponse::Complete(result), true))
        }
        _ => Err(ErrorData::internal_error(text, Some(problem))),
    }
}

fn live_or(
    live: Option<Result<CallToolResponse, ErrorData>>,
    outcome: &Outcome,
) -> Result<CallToolResponse, ErrorData> {
    live.unwrap_or_else(|| from_outcome(outcome).map(|r| mark(r, false)))
}

fn mark(response: CallToolResponse, replayed: bool) -> CallToolResponse {
    match response {
        CallToolResponse::Complete(mut result) => {
            result
                .meta
                .get_or_insert_with(MetaObject::default)
                .0
                .insert(REPLAYED_META_KEY.to_owned(), Value::Bool(replayed));
            CallToolResponse::Complete(result)
        }
        other => other,
    }
}

/// Whether `result` is marked as a replay of an earlier call (`_meta["io.idem/replayed"]`).
pub fn is_replay(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get(REPLAYED_META_KEY))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock as Content;

    #[test]
    fn outcomes_round_trip_and_classify() {
        let ok = CallToolResult::success(vec![Content::text("T-1")]);
        let o = to_outcome(&Ok(ok.clone().into()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_OK, OutcomeClass::Definitive)
        );
        let CallToolResponse::Complete(replayed) = from_outcome(&o).unwrap() else {
            panic!("a complete result")
        };
        assert!(is_replay(&replayed));
        assert_eq!(replayed.content, ok.content);

        let rejected = CallToolResult::error(vec![Content::text("account closed")]);
        let o = to_outcome(&Ok(rejected.into()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_TOOL_ERROR, OutcomeClass::Definitive)
        );
        let o = to_outcome(
            &Ok(CallToolResult::error(vec![]).into()),
            OutcomeClass::Retryable,
        );
        assert_eq!(o.class(), OutcomeClass::Retryable);

        let failed = ErrorData::internal_error("db down", None);
        let o = to_outcome(&Err(failed.clone()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_FAILED, OutcomeClass::Retryable)
        );
        assert_eq!(from_outcome(&o).unwrap_err(), failed);
    }

    #[test]
    fn hints_are_honest() {
        let a = with_hints(ToolAnnotations::default(), true, Some(false));
        assert_eq!(
            (a.read_only_hint, a.idempotent_hint, a.destructive_hint),
            (Some(false), Some(true), Some(false))
        );
        let a = with_hints(ToolAnnotations::default(), false, None);
        assert_eq!((a.idempotent_hint, a.destructive_hint), (Some(false), None));
    }

    #[test]
    fn errors_carry_their_codes_and_delay() {
        let e = in_flight(Duration::from_millis(1500), false);
        assert_eq!(e.code, IN_FLIGHT);
        let data = e.data.unwrap();
        assert_eq!(data["retryAfterMs"], 1500);
        assert_eq!(data["retryAfterSeconds"], 2);
        assert_eq!(
            key_required("create_ticket").code,
            ErrorCode::INVALID_PARAMS
        );
        assert!(
            key_required("create_ticket")
                .message
                .contains("needs an idempotency key")
        );
    }
}
