//! [`IdempotencyLayer`]: the tower layer and its settings.

use std::fmt;
use std::sync::Arc;

use http::StatusCode;
use http::request::Parts;
use idem_core::{Executor, OutcomeClass, Tool};
use serde_json::Value;

use crate::Problem;
use crate::answer::{ClassifyFn, default_classify};
use crate::keyless::Choose;
use crate::replay::Replay;

/// The default request body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

type PrincipalFn = dyn Fn(&Parts) -> Result<String, Problem> + Send + Sync;
pub(crate) type FingerprintFn = dyn Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync;

/// Makes the routes it wraps exactly-once per `Idempotency-Key` (contract
/// [§4](idem_core::contract#refusals)–[§5](idem_core::contract#http)).
///
/// For each request: reads and validates the key (400 `key-required` / `invalid-key`), derives
/// the scope from the principal the extractor returns plus the request path, reads the body
/// (413 over the limit, 400 if not JSON), fingerprints method + path + the query string
/// (parameters sorted, see [`canonical_query`](crate::canonical_query)) + canonical JSON body, and
/// runs the inner service through the [`Executor`]: once per (scope, key). The answer is the
/// tool's status with `{"ok", "idempotent_replay", "original_response"}`; a repeat gets the same
/// status and body with `"idempotent_replay": true` and `Idempotency-Replayed: true` (or, in
/// [`Replay::Verbatim`] mode, the tool's own response: see [`replay`](Self::replay)); same key
/// with another body is 422, a repeat while the first runs is 409 with `Retry-After`, a store
/// that is down is 503 — each an `application/problem+json` body.
///
/// A request with `Prefer: wait=N` that finds its operation in flight waits for the answer
/// ([contract §5.2](idem_core::contract#waiting)): at most the least of N, the layer's
/// tool's [maximum wait](idem_core::Tool::max_wait) and the holder's remaining lease. The answer
/// of a request that waited carries `Preference-Applied: wait=B`, B that bound without the lease
/// (the replay, the tool's own answer if the record became claimable and it ran, or 409 if the
/// bound passed). A request without a key whose key the layer derived waits the same way
/// without asking, up to the maximum wait ([contract §5.1](idem_core::contract#keyless); off
/// with [`ToolBuilder::derived_key_wait`](idem_core::ToolBuilder::derived_key_wait)); a
/// keyed request that did not ask is answered 409 at once. The 409's `Retry-After` is what is
/// left of the tool's processing window
/// ([`ToolBuilder::processing_window`](idem_core::ToolBuilder::processing_window); without
/// one, of the lease), in whole seconds, at least 1.
///
/// The claim, the inner service and the completion run in one spawned task per request: a client
/// that disconnects (its deadline passed) cannot cancel a tool halfway; the outcome is recorded
/// and its retry gets the replay. The
/// [`idem_core::Attempt`] is put in the request's extensions, so a handler can complete the
/// record in the same transaction as its effect and call
/// [`Attempt::mark_recorded`](idem_core::Attempt::mark_recorded).
///
/// Per layer: [`tool`](Self::tool) chooses what a request without a key gets
/// (refused by default; a key derived from its body; or unprotected), and
/// [`fingerprint_with`](Self::fingerprint_with) chooses the part of the body that identifies a
/// request.
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) executor: Executor,
    pub(crate) tool: Tool,
    pub(crate) principal: Arc<PrincipalFn>,
    pub(crate) classify: Arc<ClassifyFn>,
    pub(crate) body_limit: usize,
    pub(crate) replay: Replay,
    pub(crate) key_from: Choose,
    pub(crate) fingerprint: Option<Arc<FingerprintFn>>,
    pub(crate) in_doubt_when_stale: bool,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("executor", &self.executor)
            .field("tool", &self.tool)
            .field("body_limit", &self.body_limit)
            .field("replay", &self.replay)
            .field("key_from", &self.key_from.is_some())
            .field("fingerprint_with", &self.fingerprint.is_some())
            .field("in_doubt_when_stale", &self.in_doubt_when_stale)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer running the routes it wraps as the executor's [tool](Executor::tool) (see
    /// [`tool`](Self::tool)) through `executor`, with `principal` naming who sent a request (a
    /// tenant or user id taken from the authenticated request parts; an `Err` refuses the
    /// request). Each request runs in a task of its own (claim, tool and completion together,
    /// [`Executor::execute`]: on `executor`'s own spawner if it has one, else on the tokio
    /// runtime), so claims and completions survive dropped callers with or without a spawner on
    /// `executor`, without a task hop each.
    pub fn new(
        executor: Executor,
        principal: impl Fn(&Parts) -> Result<String, Problem> + Send + Sync + 'static,
    ) -> Self {
        Self {
            tool: executor.tool().clone(),
            executor,
            principal: Arc::new(principal),
            classify: Arc::new(default_classify),
            body_limit: DEFAULT_BODY_LIMIT,
            replay: Replay::Envelope,
            key_from: None,
            fingerprint: None,
            in_doubt_when_stale: false,
        }
    }

    /// Runs the routes this layer wraps as `tool`: its policy, processing window, maximum wait,
    /// and what a request without an `Idempotency-Key` header gets ([contract
    /// §5.1](idem_core::contract#keyless)); a key the request sends always wins, and an invalid
    /// one is refused (400) whatever the source.
    ///
    /// - [`KeySource::Refuse`](idem_core::KeySource::Refuse) (the default): 400 `key-required`,
    ///   nothing runs.
    /// - [`KeySource::Arguments`](idem_core::KeySource::Arguments): the key is derived from the
    ///   canonical JSON body (all of it, or the values at the source's JSON pointers, or what
    ///   [`key_from`](Self::key_from) picks), in the request's scope (principal and path). The
    ///   same body within the tool's key window replays: what a client with a retry policy and
    ///   no key needs; a deliberate repeat must differ in what the key covers.
    /// - [`KeySource::ModelArgument`](idem_core::KeySource::ModelArgument): the key is the body's
    ///   field of that name (a string the model fills), taken out of the body before the
    ///   fingerprint and before the tool sees it; a body without it is 400 `key-required`.
    /// - [`KeySource::Unprotected`](idem_core::KeySource::Unprotected): the request passes
    ///   straight through to the tool, unprotected (it runs every time; no body limit, principal
    ///   or record), counted in `idem_unprotected_total{transport="http"}`.
    /// - [`KeySource::Request`](idem_core::KeySource::Request) is MCP's (HTTP has no request
    ///   id): refused as `Refuse`.
    ///
    /// The answer to a request under a derived key carries `Idempotency-Key-Source: arguments`
    /// (or `model_argument`), on the first execution and on every replay. Such a request that
    /// finds the same operation in flight is waited for (its client cannot send `Prefer: wait`),
    /// up to the tool's maximum wait, and gets the replay, unless the tool turned that off.
    ///
    /// ```
    /// # use idem_core::{Executor, MemoryStore};
    /// use idem_core::{KeySource, Tool};
    /// use idem_http::IdempotencyLayer;
    /// # let executor = Executor::new(MemoryStore::new());
    /// // A client that retries without a key: the same order body within an hour is one order.
    /// let tool = Tool::builder()
    ///     .key_source(KeySource::arguments_at(["/account", "/items"]))
    ///     .build()?;
    /// let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".into())).tool(tool);
    /// # Ok::<(), idem_core::ToolError>(())
    /// ```
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tool = tool;
        self
    }

    /// Chooses how answers look: [`Replay::Envelope`] (the default) or [`Replay::Verbatim`]
    /// (the tool's own response; a repeat gets its status, the listed headers and the body byte
    /// for byte, plus `Idempotency-Replayed: true`). Refusals are `application/problem+json` in
    /// both modes.
    ///
    /// A record keeps the shape it was stored in: switching modes on a live store is safe, but a
    /// record stored in envelope mode replays in verbatim mode as its JSON body with
    /// `Content-Type: application/json` (no headers were kept), and one stored verbatim replays
    /// in envelope mode with its body as `original_response`.
    pub fn replay(mut self, replay: Replay) -> Self {
        self.replay = replay;
        self
    }

    /// Under a tool whose key source is [`KeySource::Arguments`](idem_core::KeySource::Arguments),
    /// derives the key of a request without one from the value `choose` returns (as
    /// [`fingerprint_with`](Self::fingerprint_with) chooses the fingerprint's part) instead of the
    /// whole body. An `Err` refuses the request.
    pub fn key_from(
        mut self,
        choose: impl Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync + 'static,
    ) -> Self {
        self.key_from = Some(Arc::new(choose));
        self
    }

    /// Chooses what of the JSON body identifies a request: the fingerprint covers the method,
    /// the path, the [`canonical_query`](crate::canonical_query) and the value `choose` returns
    /// instead of the whole body. Two requests with one key whose chosen values are equal (as
    /// canonical JSON) get the replay; otherwise 422. An `Err` refuses the request (nothing is
    /// recorded, the tool does not run). The request still has to be JSON.
    ///
    /// Identify a payment by its account and amount, not by a free-text note (what AWS Lambda
    /// Powertools calls `payload_validation_jmespath="[account, payment.amount]"`; the key itself
    /// still comes from the `Idempotency-Key` header):
    ///
    /// ```
    /// # use idem_core::{Executor, MemoryStore};
    /// use idem_http::{IdempotencyLayer, Problem};
    /// use serde_json::json;
    /// # let executor = Executor::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".into()))
    ///     .fingerprint_with(|_parts, body| {
    ///         // A missing field is `null`: say so if that is not the same request to you.
    ///         Ok(json!([body.pointer("/account"), body.pointer("/payment/amount")]))
    ///     });
    /// ```
    pub fn fingerprint_with(
        mut self,
        choose: impl Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Some(Arc::new(choose));
        self
    }

    /// Answers a repeat that finds its record stale (the holder's lease ended and nobody took it
    /// over: [`StalePolicy::Reconcile`](idem_core::StalePolicy::Reconcile)) with `409` problem
    /// `urn:idem:problem:in-doubt`, without `Retry-After`, instead of `in-flight`: for a layer in
    /// front of a tool whose effect it cannot see and no reconciler settles (a proxy, [contract
    /// §5](idem_core::contract#http)), where retrying later changes nothing until an operator
    /// settles the key (`idem keys resolve` or `release`).
    pub fn in_doubt_when_stale(mut self) -> Self {
        self.in_doubt_when_stale = true;
        self
    }

    /// Replaces [`default_classify`].
    pub fn classify_with(
        mut self,
        classify: impl Fn(StatusCode) -> OutcomeClass + Send + Sync + 'static,
    ) -> Self {
        self.classify = Arc::new(classify);
        self
    }

    /// Sets the request body limit in bytes (413 beyond it).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The executor.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }
}
