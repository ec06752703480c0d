//! How a side-effecting tool is protected, and whose call it is.

use std::time::Duration;

use idem_core::OutcomeClass;
use rmcp::RoleServer;
use rmcp::service::RequestContext;

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
/// extensions, which rmcp hands on inside `http::request::Parts`). [`IdempotentTools`](super::IdempotentTools) scopes
/// keys by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

pub(super) type PrincipalFn = dyn Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync;

/// The principal [`IdempotentTools`](super::IdempotentTools) finds by default: a [`Principal`] in the request context's
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
