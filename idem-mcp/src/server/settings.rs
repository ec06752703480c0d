//! How a side-effecting tool is protected, and whose call it is.

use std::time::Duration;

use idem_core::{KeySource, OutcomeClass};
use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// How one side-effecting tool is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSettings {
    /// What a call without a key gets ([contract §5.1](idem_core::contract#keyless)): refused
    /// (the default), a key derived from its arguments, from the argument the model fills, from
    /// the request, or no protection. A key the caller sends always wins.
    pub key_source: KeySource,
    /// How long a derived key's record is kept, its window: the same call within it replays
    /// ([`KeySource::DEFAULT_WINDOW`], 1 hour). Must exceed the executor's lease.
    pub key_window: Duration,
    /// The tool's published processing window (its p99), shown in its description; a call
    /// that finds its operation in flight is told to retry when what is left of it has passed
    /// (`retryAfterMs`), not when the whole lease has.
    pub processing_window: Duration,
    /// Whether a call under a derived key (it sent none) that finds its operation in flight is
    /// waited for, up to the executor's maximum wait, and answered with the result (on by
    /// default): its client cannot ask to wait ([contract §5.1](idem_core::contract#keyless)).
    /// `false`: it is told [`IN_FLIGHT`](crate::IN_FLIGHT) at once, as a keyed call that did
    /// not ask to wait is.
    pub derived_key_wait: bool,
    /// The class of a result with `isError: true` (default definitive: a business answer).
    pub tool_error: OutcomeClass,
    /// The `destructiveHint` annotation; `None` keeps what the tool declared.
    pub destructive: Option<bool>,
    /// Whether a call of the tool from a client that declared MCP's tasks extension is answered
    /// with a task, the tool running on after the answer ([contract
    /// §5.3](idem_core::contract#tasks)); needs [`IdempotentTools::tasks`](super::IdempotentTools::tasks).
    /// Off by default.
    pub tasks: bool,
    /// The polling interval a task suggests (`pollIntervalMs`; default 1 s).
    pub poll_interval: Duration,
}

impl Default for ToolSettings {
    fn default() -> Self {
        Self {
            key_source: KeySource::Refuse,
            key_window: KeySource::DEFAULT_WINDOW,
            processing_window: Duration::from_secs(30),
            derived_key_wait: true,
            tool_error: OutcomeClass::Definitive,
            destructive: None,
            tasks: false,
            poll_interval: Duration::from_secs(1),
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

    /// Sets [`ToolSettings::key_source`].
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.key_source = source;
        self
    }

    /// Sets [`ToolSettings::key_window`].
    pub fn key_window(mut self, window: Duration) -> Self {
        self.key_window = window;
        self
    }

    /// Sets [`ToolSettings::derived_key_wait`].
    pub fn derived_key_wait(mut self, on: bool) -> Self {
        self.derived_key_wait = on;
        self
    }

    /// Sets [`ToolSettings::tool_error`].
    pub fn tool_error(mut self, class: OutcomeClass) -> Self {
        self.tool_error = class;
        self
    }

    /// Sets [`ToolSettings::tasks`].
    pub fn tasks(mut self, on: bool) -> Self {
        self.tasks = on;
        self
    }

    /// Sets [`ToolSettings::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
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
/// extensions, which rmcp hands on inside `http::request::Parts`).
/// [`IdempotentTools`](super::IdempotentTools) scopes keys by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

pub(super) type PrincipalFn = dyn Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync;

/// The principal [`IdempotentTools`](super::IdempotentTools) finds by default: a [`Principal`] in
/// the request context's extensions, or in those of the HTTP request (`http::request::Parts`).
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
