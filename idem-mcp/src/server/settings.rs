//! How a side-effecting tool is protected, and whose call it is.

use std::time::Duration;

use idem_core::{OutcomeClass, Tool};
use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// How one side-effecting tool is protected: its [`Tool`] (policy, processing window, maximum
/// wait, key source and window, derived-key wait, tasks; checked when it was built), and what
/// only MCP asks.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{KeySource, Tool};
/// use idem_mcp::ToolSettings;
/// let settings = ToolSettings::new(
///     Tool::builder()
///         .processing_window(Duration::from_secs(2))
///         .key_source(KeySource::arguments())
///         .build()?,
/// )
/// .destructive(false);
/// # Ok::<(), idem_core::ToolError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSettings {
    /// The tool's settings. A call without a key gets what its key source says ([contract
    /// §5.1](idem_core::contract#keyless)): refused (the default), a key derived from its
    /// arguments, from the argument the model fills, from the request, or no protection; a
    /// call of a tool with [`Tool::tasks`] from a client that declared MCP's tasks extension is
    /// answered with a task ([contract §5.3](idem_core::contract#tasks); needs
    /// [`IdempotentTools::tasks`](super::IdempotentTools::tasks)).
    pub tool: Tool,
    /// The class of a result with `isError: true` (default definitive: a business answer).
    pub tool_error: OutcomeClass,
    /// The `destructiveHint` annotation; `None` keeps what the tool declared.
    pub destructive: Option<bool>,
    /// The polling interval a task suggests (`pollIntervalMs`; default 1 s).
    pub poll_interval: Duration,
}

impl Default for ToolSettings {
    fn default() -> Self {
        Self::new(Tool::default())
    }
}

impl ToolSettings {
    /// `tool`, with MCP's defaults.
    pub fn new(tool: Tool) -> Self {
        Self {
            tool,
            tool_error: OutcomeClass::Definitive,
            destructive: None,
            poll_interval: Duration::from_secs(1),
        }
    }

    /// Sets [`ToolSettings::tool_error`].
    pub fn tool_error(mut self, class: OutcomeClass) -> Self {
        self.tool_error = class;
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
