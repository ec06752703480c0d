//! RFC 9457 problem responses: each [`Problem`] (idem-core's protocol-neutral
//! [`Refusal`](idem_core::Refusal)) as `application/problem+json` with its stable `type` and
//! HTTP status ([contract §4](idem_core::contract#refusals)).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

/// A refusal the layer answers with instead of calling the tool: idem-core's
/// [`Refusal`](idem_core::Refusal), answered over HTTP by [`ProblemResponse`].
pub use idem_core::Refusal as Problem;

/// A [`Problem`] over HTTP: its status and its `application/problem+json` response.
pub trait ProblemResponse {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// The problem as an `application/problem+json` response (`Retry-After` in whole seconds
    /// where the refusal says when to ask again).
    fn to_response<B: From<Bytes>>(&self) -> Response<B>;
}

impl ProblemResponse for Problem {
    fn status(&self) -> StatusCode {
        match self {
            Self::KeyRequired
            | Self::InvalidKey(_)
            | Self::InvalidBody(_)
            | Self::InvalidScope(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            // The store failed otherwise, and any refusal a later idem-core adds.
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn to_response<B: From<Bytes>>(&self) -> Response<B> {
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
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The answer of [`IdempotencyLayer::in_doubt_when_stale`](crate::IdempotencyLayer::in_doubt_when_stale)
/// to a repeat that finds its record stale: `409`, problem `urn:idem:problem:in-doubt`, no
/// `Retry-After` (waiting changes nothing).
pub(crate) fn in_doubt<B: From<Bytes>>() -> Response<B> {
    let body = serde_json::json!({
        "type": "urn:idem:problem:in-doubt",
        "title": "The first request with this key may have taken effect",
        "status": 409,
        "detail": "the first request with this key was forwarded and never answered, so its effect may have happened; it will not run again until an operator settles the key (idem keys resolve or idem keys release)",
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::CONFLICT;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
