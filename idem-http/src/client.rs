//! The agent side: a tool client that reuses one key on every attempt ([contract
//! §6](idem_core::contract#client-side), client side).

use std::time::Duration;

use http::StatusCode;
use idem_core::IdempotencyKey;
use idem_core::contract::{ListedTool, ToolListing};
use serde_json::Value;
use tokio::time::Instant;

use crate::{IDEMPOTENCY_KEY, IDEMPOTENCY_REPLAYED, key_header};

pub use idem_core::retry::{DeadlineExceeded, RetryPolicy, ShortAttempt};

/// Why a call produced no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The per-attempt deadline is below the tool's published minimum (processing window plus
    /// store write): every attempt would be cut off while the tool works.
    #[error(transparent)]
    DeadlineBelowMinimum(#[from] ShortAttempt),
    /// The overall deadline passed before an answer.
    #[error(transparent)]
    DeadlineExceeded(#[from] DeadlineExceeded),
    /// The server refused the request in a way a retry cannot fix (400, 401, 413, 422…).
    #[error("the tool refused the request: {status} {body}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The body (an `application/problem+json` object for idem's refusals).
        body: Value,
    },
    /// The tool could not be discovered from `GET /tools`.
    #[error("tool discovery failed: {0}")]
    Discovery(String),
    /// The HTTP client could not be built, or a request could not be (a bad URL; `https://`
    /// in a build without TLS: enable the `rustls` feature, or pass a client that has TLS).
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    /// The TLS handshake with the tool failed (its certificate is not trusted, has expired or
    /// does not name the host): not retried, since no retry can fix it.
    #[error("TLS with the tool failed: {message}")]
    Tls {
        /// The error and its causes, for people (e.g. `invalid peer certificate: UnknownIssuer`).
        message: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
}

/// Whether `err` is a failed TLS handshake. rustls reports it as an I/O error of kind
/// `InvalidData` (tokio-rustls' convention), which a refused, reset or timed-out connection never
/// is; the connector may wrap that in another I/O error, whose `source()` skips it, so wrapped
/// I/O errors are opened with `get_ref`.
fn is_tls_failure(err: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        let mut io = e.downcast_ref::<std::io::Error>();
        while let Some(inner) = io {
            if inner.kind() == std::io::ErrorKind::InvalidData {
                return true;
            }
            io = inner
                .get_ref()
                .and_then(|e| e.downcast_ref::<std::io::Error>());
        }
        source = e.source();
    }
    false
}

/// `err` and its causes on one line.
fn with_causes(err: &reqwest::Error) -> String {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}

/// The answer to a call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    /// The tool's status.
    pub status: StatusCode,
    /// The envelope `{"ok", "idempotent_replay", "original_response"}`.
    pub body: Value,
    /// Whether the final answer was a replay of an earlier execution.
    pub replayed: bool,
    /// HTTP attempts made (1 if the first answered).
    pub attempts: u32,
    /// How many attempts were answered 409 (in flight).
    pub in_flight: u32,
    /// How many attempts timed out or failed to connect.
    pub failed_attempts: u32,
}

impl ToolAnswer {
    /// The tool's own response body.
    pub fn original_response(&self) -> &Value {
        &self.body["original_response"]
    }
}

/// A client for one side-effecting HTTP tool: attaches the key in the `Idempotency-Key` header
/// after the model's arguments are final, never changes it between attempts, retries timeouts,
/// connection errors, 409, 429, 502, 503 and 504 with exponential backoff and jitter (honouring
/// `Retry-After`), and stops at the overall deadline.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::IdempotencyKey;
/// use idem_http::client::{RetryPolicy, ToolClient};
/// let client = ToolClient::discover(
///     "http://127.0.0.1:8787/tools",
///     "create_ticket",
///     "http://127.0.0.1:8787/tools/create_ticket",
///     RetryPolicy::default(),
/// )
/// .await?;
/// // From the orchestrator's durable step, never from the model.
/// let key = IdempotencyKey::for_step("wf-8812", "step-3", "create_ticket")?;
/// let answer = client.call(&key, &serde_json::json!({"title": "Printer on fire", "account_id": "A-7"})).await?;
/// println!("{} replayed={}", answer.original_response(), answer.replayed);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ToolClient {
    http: reqwest::Client,
    url: String,
    policy: RetryPolicy,
    min_client_deadline: Option<Duration>,
    headers: http::HeaderMap,
    wait: bool,
}

/// Installs ring as rustls' process-wide crypto provider, when the application installed none.
///
/// With the `rustls` feature, reqwest is built with rustls and *no* crypto provider of its own
/// (its `rustls-no-provider`, so that the graph holds one provider, ring, the one sqlx and redis
/// use, rather than also aws-lc-rs): it takes rustls' process-wide default, and building a
/// `reqwest::Client` panics while none is installed. Cargo unifies features, so this holds for
/// every reqwest client in your process (rmcp's HTTP transport included) unless something else
/// turns on one of reqwest's own TLS backends (its default features do). [`ToolClient`] calls
/// this itself; call it (or install a provider yourself) before building your own clients.
/// Without the `rustls` feature it does nothing.
pub fn install_crypto_provider() {
    #[cfg(feature = "rustls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The `reqwest::Client` [`ToolClient::new`] builds (after [`install_crypto_provider`]), for
/// your own requests too.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    http_client_builder().build()
}

/// A `reqwest::ClientBuilder` after [`install_crypto_provider`], for your own clients with
/// settings of their own (a connection per request, your roots).
pub fn http_client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

impl ToolClient {
    /// A client for the tool at `url` (a `POST` endpoint). With `min_client_deadline` (the tool's
    /// published `min_client_deadline_ms`), refuses a policy whose attempt timeout is shorter,
    /// unless `policy.allow_short_attempts`.
    pub fn new(
        url: impl Into<String>,
        policy: RetryPolicy,
        min_client_deadline: Option<Duration>,
    ) -> Result<Self, ClientError> {
        policy.check_minimum(min_client_deadline)?;
        Ok(Self {
            http: http_client()?,
            url: url.into(),
            policy,
            min_client_deadline,
            headers: http::HeaderMap::new(),
            wait: true,
        })
    }

    /// Sends `name: value` with every attempt (e.g. the caller's authentication or tenant).
    /// A header that is not valid HTTP is ignored; `Idempotency-Key` cannot be set this way.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::try_from(name),
            http::HeaderValue::try_from(value),
        ) && name != IDEMPOTENCY_KEY
        {
            self.headers.insert(name, value);
        }
        self
    }

    /// The same client, sending every attempt with `http` instead of the client [`ToolClient::new`]
    /// built: for your own roots or client certificate
    /// ([`reqwest::ClientBuilder::tls_certs_merge`], [`reqwest::ClientBuilder::tls_certs_only`]), a
    /// proxy, a shared connection pool or another TLS backend. The policy still sets each attempt's
    /// timeout.
    pub fn with_http_client(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// Reads tool `name`'s `min_client_deadline_ms` from the listing at `tools_url` (`GET /tools`,
    /// an [`idem_core::contract::ToolListing`]), then builds the client as [`ToolClient::new`]
    /// does.
    pub async fn discover(
        tools_url: &str,
        name: &str,
        url: impl Into<String>,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        let http = http_client()?;
        Self::discover_with(http, tools_url, name, url, policy).await
    }

    /// [`ToolClient::discover`] with your own `reqwest::Client`, for the listing and then for
    /// every call (as [`ToolClient::with_http_client`]).
    pub async fn discover_with(
        http: reqwest::Client,
        tools_url: &str,
        name: &str,
        url: impl Into<String>,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        let listing: ToolListing = http
            .get(tools_url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| ClientError::Discovery(e.to_string()))?
            .json()
            .await
            .map_err(|e| ClientError::Discovery(e.to_string()))?;
        let min = listing
            .tool(name)
            .and_then(ListedTool::min_client_deadline)
            .ok_or_else(|| {
                ClientError::Discovery(format!(
                    "{tools_url} lists no tool {name:?} with min_client_deadline_ms"
                ))
            })?;
        Ok(Self::new(url, policy, Some(min))?.with_http_client(http))
    }

    /// The same client without `Prefer: wait`: an attempt that finds the operation in flight is
    /// answered 409 at once and retried after `Retry-After`. By default each attempt asks the
    /// tool to wait for the in-flight answer within the attempt's own timeout (its whole seconds
    /// after a 500 ms margin, [contract §5.2](idem_core::contract#waiting)).
    pub fn without_wait(mut self) -> Self {
        self.wait = false;
        self
    }

    /// The tool's minimum client deadline, if known.
    pub fn min_client_deadline(&self) -> Option<Duration> {
        self.min_client_deadline
    }

    /// Calls the tool with `arguments` under `key`, retrying as the policy says. Every attempt
    /// carries the same key and the same body.
    pub async fn call(
        &self,
        key: &IdempotencyKey,
        arguments: &Value,
    ) -> Result<ToolAnswer, ClientError> {
        let started = Instant::now();
        let deadline = started + self.policy.overall_deadline;
        let body = arguments.to_string();
        let (mut attempts, mut in_flight, mut failed) = (0u32, 0u32, 0u32);
        let mut backoff = self.policy.backoff();
        loop {
            let now = Instant::now();
            if now >= deadline {
                let last = "deadline reached".into();
                return Err(DeadlineExceeded { attempts, last }.into());
            }
            attempts += 1;
            let timeout = self.policy.attempt_timeout.min(deadline - now);
            let mut request = self.http.post(&self.url).headers(self.headers.clone());
            if let Some(wait) = self
                .wait
                .then(|| crate::prefer::prefer_wait_within(timeout))
                .flatten()
            {
                request = request.header(crate::prefer::PREFER, wait);
            }
            let sent = request
                .header(IDEMPOTENCY_KEY, key_header(key))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .timeout(timeout)
                .send()
                .await;
            let (retry_after, last) = match sent {
                Ok(response) => {
                    let status = response.status();
                    if !retryable_status(status) {
                        let replayed = response
                            .headers()
                            .get(IDEMPOTENCY_REPLAYED)
                            .is_some_and(|v| v == "true");
                        let text = response.text().await.unwrap_or_default();
                        let body: Value =
                            serde_json::from_str(&text).unwrap_or(Value::String(text));
                        if status.is_client_error() {
                            return Err(ClientError::Refused { status, body });
                        }
                        return Ok(ToolAnswer {
                            status,
                            body,
                            replayed,
                            attempts,
                            in_flight,
                            failed_attempts: failed,
                        });
                    }
                    if status == StatusCode::CONFLICT {
                        in_flight += 1;
                    }
                    let retry_after = response
                        .headers()
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    (retry_after, format!("HTTP {status}"))
                }
                Err(e) if is_tls_failure(&e) => {
                    return Err(ClientError::Tls {
                        message: with_causes(&e),
                        source: e,
                    });
                }
                Err(e) if e.is_builder() => return Err(ClientError::Http(e)),
                Err(e) => {
                    failed += 1;
                    (None, format!("{e}"))
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

/// Statuses worth retrying with the same key: in flight, rate limited, store or gateway down.
fn retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 409 | 429 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_rule_refuses_short_attempts_unless_opted_out() {
        let short = RetryPolicy {
            attempt_timeout: Duration::from_millis(500),
            ..RetryPolicy::default()
        };
        let err =
            ToolClient::new("http://x", short, Some(Duration::from_millis(1500))).unwrap_err();
        assert!(matches!(err, ClientError::DeadlineBelowMinimum(_)));
        assert!(err.to_string().contains("minimum client deadline"));
        let opted = RetryPolicy {
            allow_short_attempts: true,
            ..short
        };
        assert!(ToolClient::new("http://x", opted, Some(Duration::from_millis(1500))).is_ok());
        assert!(ToolClient::new("http://x", short, None).is_ok());
    }

    #[test]
    fn retryable_statuses() {
        assert!(retryable_status(StatusCode::CONFLICT));
        assert!(!retryable_status(StatusCode::UNPROCESSABLE_ENTITY));
    }
}
