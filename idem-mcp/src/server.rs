//! [`IdempotentTools`]: the server side, used from a [`ServerHandler`](rmcp::ServerHandler)'s
//! `call_tool`, `list_tools` and `get_info`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Answer, Call, CallKey, Executor, Fingerprint, KeyOrigin, KeyStore, Outcome, OutcomeClass,
    Refusal, Reply, Scope, ToolContract,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

mod describe;
mod keyless;
mod record;
mod refusal;
mod settings;
mod tasks;
mod wrap;

pub use describe::{CAPABILITY, TOOL_META_KEY};
pub use record::{KEY_SOURCE_META_KEY, NOT_KEPT_META_KEY, REPLAYED_META_KEY, is_replay};
pub use refusal::{FINGERPRINT_MISMATCH, IN_FLIGHT, STORE_UNAVAILABLE, UNAUTHENTICATED};
pub use settings::{Principal, ToolSettings, default_principal};
pub use wrap::IdempotentServer;

use keyless::key_of_call;
use record::{from_outcome, mark, mark_source, to_outcome};
use refusal::refuse_call;
use settings::PrincipalFn;
use tasks::TaskIds;

/// Makes the side-effecting tools of an rmcp server exactly-once per idempotency key.
///
/// Register each side-effecting tool with [`IdempotentTools::tool`], then from the server's
/// handler call:
/// - [`IdempotentTools::call`] in `call_tool`, with the tool's own dispatch as the last argument
///   ([`IdempotentTools::call_routed`] for an rmcp `ToolRouter`);
/// - [`IdempotentTools::describe`] on the tools listed by `list_tools`
///   ([`IdempotentTools::list_routed`] for a `ToolRouter`);
/// - [`IdempotentTools::advertise`] on the `get_info` answer.
///
/// For a registered tool, [`IdempotentTools::call`]:
/// 1. reads the key ([`crate::key`]: `params.idempotencyKey`, then
///    `params._meta["io.idem/idempotencyKey"]`), refusing an invalid one with `-32602`; without a
///    key it follows the tool's [`KeySource`](idem_core::KeySource) (`ToolBuilder::key_source`,
///    [contract §5.1](idem_core::contract#keyless)): refused with `-32602` (the default), a key
///    derived from the arguments, from the model argument (taken out of the arguments before
///    anything else sees them; its absence is refused with `-32602`), from the session and
///    request id, or run unprotected (counted in `idem_unprotected_total`). A derived key's
///    record is kept for the tool's `key_window`; the answer says the key's source in
///    `_meta["io.idem/keySource"]`;
/// 2. scopes the record by the principal (see [`IdempotentTools::principal_with`]; the default
///    looks for a [`Principal`]) and the tool name. A call without a principal is refused with
///    [`UNAUTHENTICATED`] (nothing claimed, the tool not run), unless the server opted into one
///    shared scope with [`IdempotentTools::allow_anonymous`];
/// 3. fingerprints the tool name and the canonical arguments;
/// 4. runs the claim, the tool and the completion through the [`Executor`] in one spawned task (a
///    client that goes away cannot cancel it halfway; its retry gets the recorded answer), with the
///    [`Attempt`](idem_core::Attempt) in the request context's extensions (so a tool can complete
///    the record in its own transaction and call `mark_recorded`);
/// 5. records the `CallToolResult` as the outcome: a success and an `isError: true` result are
///    definitive (the latter per `ToolSettings::tool_error`); an `Err` from the tool (an
///    internal or transport failure) is retryable;
/// 6. answers with the result marked `"io.idem/replayed": false` in its `_meta`; a repeat gets
///    the stored result marked `true`. Same key with other arguments: error
///    [`FINGERPRINT_MISMATCH`]; a repeat while the first runs: [`IN_FLIGHT`] with
///    `data.retryAfterMs` (what is left of the tool's processing window), unless it asked to wait
///    (`_meta["io.idem/wait"]`) or its key was derived (it sent none, so its client cannot ask:
///    it is waited for, `ToolBuilder::derived_key_wait`), when it waits for the result; a store that is down: [`STORE_UNAVAILABLE`]; a store that failed
///    otherwise: an internal error (`-32603`) of type `store-error`.
///
/// Other tools are passed through untouched.
#[derive(Clone)]
pub struct IdempotentTools {
    executor: Executor,
    tools: Arc<HashMap<String, ToolSettings>>,
    principal: Arc<PrincipalFn>,
    anonymous: Option<String>,
    store_write: Duration,
    /// The session of a transport without session ids (stdio): random per value.
    session: Arc<str>,
    /// Task ids, when the server serves MCP tasks ([`IdempotentTools::tasks`]).
    tasks: Option<Arc<TaskIds>>,
}

impl fmt::Debug for IdempotentTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTools")
            .field("executor", &self.executor)
            .field("tools", &self.tools)
            .field("anonymous", &self.anonymous)
            .field("store_write", &self.store_write)
            .field("tasks", &self.tasks.is_some())
            .finish_non_exhaustive()
    }
}

/// What the store write costs at most by default, added to a tool's processing window for the
/// minimum client retry deadline: [`ToolContract::DEFAULT_STORE_WRITE`], 500 ms.
pub const DEFAULT_STORE_WRITE: Duration = ToolContract::DEFAULT_STORE_WRITE;

impl IdempotentTools {
    /// Protects tools through `executor`. Give it a lease at least the longest minimum client
    /// deadline. Each call runs in a task of its own (claim, tool and completion together,
    /// [`Executor::execute`]: on `executor`'s own spawner if it has one, else on the tokio
    /// runtime), so claims and completions survive a dropped request with or without a spawner
    /// on `executor`, without a task hop each.
    pub fn new(executor: Executor) -> Self {
        Self {
            executor,
            tools: Arc::new(HashMap::new()),
            principal: Arc::new(default_principal),
            anonymous: None,
            store_write: DEFAULT_STORE_WRITE,
            session: idem_core::Token::new(0).id_hex().into(),
            tasks: None,
        }
    }

    /// An executor over `store` with the system clock (spawning on tokio).
    pub fn with_store(store: impl KeyStore) -> Self {
        Self::new(Executor::new(store))
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

    /// Serves MCP's tasks extension ([contract §5.3](idem_core::contract#tasks)) from the store
    /// for the tools whose settings allow tasks ([`Tool::tasks`](idem_core::Tool::tasks)): a call of such a tool
    /// from a client that declared the extension claims its key, starts the tool and answers
    /// with a task at once; the same call again gets the same task; the server handler answers
    /// `tasks/get` and `tasks/cancel` with [`IdempotentTools::get_task`] and
    /// [`IdempotentTools::cancel_task`], and [`IdempotentTools::advertise`] declares the
    /// extension.
    ///
    /// Task ids name the record, sealed with `secret` (AES-256-GCM) for the caller's principal:
    /// opaque, unguessable, and opened only within the caller's scope. Every replica that serves
    /// the same store must have the same secret (and keep it across restarts, like a cookie
    /// key): a task id sealed under another secret is unknown.
    pub fn tasks(mut self, secret: [u8; 32]) -> Self {
        self.tasks = Some(Arc::new(TaskIds::new(secret)));
        self
    }

    /// Whether these tools serve MCP tasks ([`IdempotentTools::tasks`]).
    pub(crate) fn serves_tasks(&self) -> bool {
        self.tasks.is_some()
    }

    /// The principal of a request, or the shared one the server opted into.
    fn principal_of(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        (self.principal)(context).or_else(|| self.anonymous.clone())
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

    /// The contract `tool` publishes, if it is side-effecting: its processing window and this
    /// server's store write budget ([contract §5](idem_core::contract#http)).
    pub fn contract(&self, tool: &str) -> Option<ToolContract> {
        self.settings(tool).map(|s| self.contract_of(s))
    }

    fn contract_of(&self, settings: &ToolSettings) -> ToolContract {
        settings.tool.contract().with_store_write(self.store_write)
    }

    /// The minimum client retry deadline of `tool`: processing window + store write ([contract
    /// §5](idem_core::contract#http)).
    pub fn min_client_deadline(&self, tool: &str) -> Option<Duration> {
        self.contract(tool).map(|c| c.min_client_deadline())
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
        mut params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        tool: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: FnOnce(CallToolRequestParams, RequestContext<RoleServer>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'static,
    {
        let name = params.name.to_string();
        let Some(settings) = self.tools.get(&name) else {
            return tool(params, context).await;
        };
        let source = settings.tool.key_source();
        let refused = |refusal: Refusal| {
            let answer = Answer::refused(refusal, "mcp");
            answer_of(answer, &name, source, KeyOrigin::Sent)
        };
        // Before anything else: without a principal (and no opt-in) nothing runs, keyed or not.
        let Some(principal) = self.principal_of(&context) else {
            return refused(Refusal::Unauthenticated(String::new()));
        };
        let key = match key_of_call(&settings.tool, &mut params, &context, &self.session) {
            Ok(CallKey::Key(key)) => key,
            Ok(CallKey::Unprotected) => {
                idem_core::metrics::count_unprotected("mcp");
                tracing::warn!(tool = %name, "side-effecting tool called without an idempotency key; running it unprotected");
                return tool(params, context).await;
            }
            Err(refusal) => return refused(refusal),
        };
        let origin = key.origin();
        let wait = crate::wait::requested_wait(&context.meta.0.0, &params);
        let scope = match Scope::from_parts([principal.as_str(), name.as_str()]) {
            Ok(scope) => scope,
            Err(e) => return refused(Refusal::InvalidScope(e.to_string())),
        };
        let fingerprint = match fingerprint_of(&name, &mut params) {
            Ok(fingerprint) => fingerprint,
            Err(e) => return refused(Refusal::InvalidBody(e.to_string())),
        };
        let call = Call::new(scope.clone(), key.clone(), fingerprint).transport("mcp");
        let tool_error = settings.tool_error;
        if self.answers_with_task(settings, &context) {
            // Answered at once with the task: nobody waits.
            return self
                .call_as_task(&principal, &name, settings, call, move |attempt| {
                    let mut context = context;
                    context.extensions.insert(attempt);
                    async move {
                        let answer = tool(params, context).await;
                        to_outcome(&answer, tool_error)
                    }
                })
                .await;
        }
        let call = call.wait(wait.unwrap_or_default());
        // Answered as it is, this call's own result; a replay is decoded from the record.
        let answer = self
            .executor
            .execute(&settings.tool, call, move |attempt| async move {
                let mut context = context;
                context.extensions.insert(attempt);
                let answer = tool(params, context).await;
                let outcome = to_outcome(&answer, tool_error);
                (answer, outcome)
            })
            .await;
        answer_of(answer, &name, source, origin)
    }

    /// [`call`](Self::call) with an rmcp `ToolRouter` as the dispatch: the whole `call_tool` of
    /// a server whose tools are `#[tool_router]` methods of `server`.
    pub async fn call_routed<S>(
        &self,
        server: &S,
        router: &ToolRouter<S>,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData>
    where
        S: Clone + Send + Sync + 'static,
    {
        let (server, router) = (server.clone(), router.clone());
        self.call(params, context, move |params, context| async move {
            router
                .call(ToolCallContext::new(&server, params, context))
                .await
        })
        .await
    }
}

/// What the caller of `tool` gets for `answer` of a call under a key from `origin`.
fn answer_of(
    answer: Answer<Result<CallToolResponse, ErrorData>>,
    tool: &str,
    source: &idem_core::KeySource,
    origin: KeyOrigin,
) -> Result<CallToolResponse, ErrorData> {
    let answer = match answer.reply {
        Reply::Replayed { outcome } => from_outcome(&outcome),
        // Also when the answer could not be recorded as this attempt's: the caller still
        // gets it (the effect happened).
        Reply::Executed { value, .. } => value.map(|r| mark(r, false)),
        Reply::Refused { refusal, .. } => Err(refuse_call(&refusal, tool, source)),
    };
    answer.map(|response| mark_source(response, origin))
}

/// The fingerprint of a call: the tool's name and its arguments (absent arguments as `{}`). The
/// arguments are lent to the fingerprint and put back as they were, not copied.
fn fingerprint_of(
    name: &str,
    params: &mut CallToolRequestParams,
) -> Result<Fingerprint, idem_core::FingerprintError> {
    let given = params.arguments.is_some();
    let arguments = Value::Object(params.arguments.take().unwrap_or_default());
    let fingerprint = Fingerprint::of_value(name, &arguments);
    if let (true, Value::Object(arguments)) = (given, arguments) {
        params.arguments = Some(arguments);
    }
    fingerprint
}
