//! RFC 9457 problem responses, one stable `type` per refusal ([contract §4](idem_core::contract#refusals)).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

/// A refusal the layer answers with instead of calling the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// No `Idempotency-Key` header (400).
    KeyRequired,
    /// The key breaks a rule (400); the message says which.
    InvalidKey(String),
    /// The body is not JSON (400).
    InvalidBody(String),
    /// The body is over the limit (413).
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The key was used with another request (422).
    FingerprintMismatch,
    /// Another attempt is processing the key (409, `Retry-After`).
    InFlight {
        /// Whole seconds to wait, at least 1.
        retry_after_secs: u64,
        /// The holder's lease has elapsed; the record waits for reconciliation.
        stale: bool,
    },
    /// The store is unavailable (503): nothing ran, try later.
    StoreUnavailable,
    /// The store failed otherwise (500): nothing ran.
    StoreError,
    /// The scope could not be derived from the request (e.g. no principal) (401).
    Unauthenticated(String),
    /// The scope built from principal and path breaks a rule (400).
    InvalidScope(String),
}

impl Problem {
    /// The stable `type` URI of the problem.
    pub fn type_uri(&self) -> &'static str {
        match self {
            Self::KeyRequired => "urn:idem:problem:key-required",
            Self::InvalidKey(_) => "urn:idem:problem:invalid-key",
            Self::InvalidBody(_) => "urn:idem:problem:invalid-body",
            Self::BodyTooLarge { .. } => "urn:idem:problem:body-too-large",
            Self::FingerprintMismatch => "urn:idem:problem:fingerprint-mismatch",
            Self::InFlight { .. } => "urn:idem:problem:in-flight",
            Self::StoreUnavailable => "urn:idem:problem:store-unavailable",
            Self::StoreError => "urn:idem:problem:store-error",
            Self::Unauthenticated(_) => "urn:idem:problem:unauthenticated",
            Self::InvalidScope(_) => "urn:idem:problem:invalid-scope",
        }
    }

    /// The stable short name of the problem: its `type` URI without `urn:idem:problem:` (the
    /// `reason` label of `idem_refusals_total`, [contract §8](idem_core::contract#observability)).
    pub fn reason(&self) -> &'static str {
        self.type_uri()
            .strip_prefix("urn:idem:problem:")
            .expect("every problem type is a urn:idem:problem: URN")
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::KeyRequired
            | Self::InvalidKey(_)
            | Self::InvalidBody(_)
            | Self::InvalidScope(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::StoreError => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::KeyRequired => "Idempotency-Key header required",
            Self::InvalidKey(_) => "Invalid Idempotency-Key",
            Self::InvalidBody(_) => "Request body is not JSON",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::FingerprintMismatch => "Idempotency-Key reused with a different request",
            Self::InFlight { .. } => "Request with this Idempotency-Key is in flight",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::StoreError => "Idempotency store error",
            Self::Unauthenticated(_) => "No principal for the request",
            Self::InvalidScope(_) => "Invalid scope",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::KeyRequired => "this endpoint has side effects: send an Idempotency-Key header made from your durable workflow step, the same on every retry".into(),
            Self::InvalidKey(why)
            | Self::InvalidBody(why)
            | Self::Unauthenticated(why)
            | Self::InvalidScope(why) => why.clone(),
            Self::BodyTooLarge { limit } => format!("the request body is over the limit of {limit} bytes"),
            Self::FingerprintMismatch => "this key was first used with a different request (method, path, query string or body); use a new key for a new operation".into(),
            Self::InFlight { retry_after_secs, stale: false } => format!("the first request with this key is still processing; retry after {retry_after_secs} s with the same key"),
            Self::InFlight { retry_after_secs, stale: true } => format!("the first request with this key stopped answering and is being reconciled; retry after {retry_after_secs} s with the same key"),
            Self::StoreUnavailable => "the operation was not run; retry later with the same key".into(),
            Self::StoreError => "the operation was not run".into(),
        }
    }

    /// The problem as an `application/problem+json` response.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let body = serde_json::json!({
            "type": self.type_uri(),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": self.detail(),
        });
        let mut response = Response::new(B::from(Bytes::from(body.to_string())));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Self::InFlight {
            retry_after_secs, ..
        } = self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        response
    }
}
