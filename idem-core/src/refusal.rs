//! [`Refusal`]: why a call got no answer from the tool, whatever the protocol
//! ([contract §4](crate::contract#refusals)).

use std::time::Duration;

use crate::outcome::problem_urn;
use crate::{Error, Outcome};

/// Why a request was refused: nothing ran for it in this call. Input the transport refuses
/// before any record is read (`KeyRequired` … `InvalidScope`) and the executor's refusals
/// ([`FingerprintMismatch`](Self::FingerprintMismatch), [`InFlight`](Self::InFlight), the store's
/// failures). `idem-http` re-exports it as `Problem`.
///
/// One value per refusal, with its stable name, its problem `type` URN, what the caller should do
/// and whether to try again. The transports map it to their wire: `idem-http` to an
/// `application/problem+json` response (with the HTTP status), `idem-mcp` to a JSON-RPC error
/// (with its code and `data.type`). [`ErrorAnswer::of`] says, for every executor [`Error`],
/// whether the caller gets the operation's answer or a refusal.
///
/// ```
/// use idem_core::{Error, ErrorAnswer, Refusal, StoreError};
///
/// let down = Error::Store(StoreError::unavailable("redis: claim", "connection refused"));
/// let ErrorAnswer::Refuse(refusal) = ErrorAnswer::of(&down) else { unreachable!() };
/// assert_eq!(refusal, Refusal::StoreUnavailable);
/// assert_eq!(refusal.name(), "store-unavailable");
/// assert_eq!(refusal.type_uri(), "urn:idem:problem:store-unavailable");
/// assert!(refusal.retry_later());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No idempotency key where the tool requires one (HTTP 400).
    KeyRequired,
    /// The key breaks a rule (HTTP 400); the message says which.
    InvalidKey(String),
    /// The request body (the arguments) is not the JSON expected (HTTP 400).
    InvalidBody(String),
    /// The body is over the limit (HTTP 413).
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The key was used with another request (HTTP 422).
    FingerprintMismatch,
    /// Another attempt is processing the key (HTTP 409 with `Retry-After`).
    InFlight {
        /// How long to wait before asking again (never zero).
        retry_after: Duration,
        /// The holder's lease has elapsed; the record waits for reconciliation.
        stale: bool,
    },
    /// The store is unavailable (HTTP 503): nothing ran, try later with the same key.
    StoreUnavailable,
    /// The store failed otherwise, or a stored answer could not be read (HTTP 500): nothing ran.
    StoreError,
    /// The scope could not be derived from the request (e.g. no principal) (HTTP 401).
    Unauthenticated(String),
    /// The scope built from principal and path or tool breaks a rule (HTTP 400).
    InvalidScope(String),
}

impl Refusal {
    /// The stable name (e.g. `"fingerprint-mismatch"`): the last part of
    /// [`type_uri`](Self::type_uri) and the `reason` label of `idem_refusals_total`
    /// ([contract §8](crate::contract#observability)).
    pub fn name(&self) -> &'static str {
        self.type_uri()
            .strip_prefix(problem_urn!(""))
            .expect("every refusal type is a problem URN")
    }

    /// The stable problem `type` URI (RFC 9457), e.g. `urn:idem:problem:fingerprint-mismatch`.
    pub fn type_uri(&self) -> &'static str {
        match self {
            Self::KeyRequired => problem_urn!("key-required"),
            Self::InvalidKey(_) => problem_urn!("invalid-key"),
            Self::InvalidBody(_) => problem_urn!("invalid-body"),
            Self::BodyTooLarge { .. } => problem_urn!("body-too-large"),
            Self::FingerprintMismatch => problem_urn!("fingerprint-mismatch"),
            Self::InFlight { .. } => problem_urn!("in-flight"),
            Self::StoreUnavailable => problem_urn!("store-unavailable"),
            Self::StoreError => problem_urn!("store-error"),
            Self::Unauthenticated(_) => problem_urn!("unauthenticated"),
            Self::InvalidScope(_) => problem_urn!("invalid-scope"),
        }
    }

    /// A short summary for people (the problem's `title`).
    pub fn title(&self) -> &'static str {
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

    /// What happened and what to do, for people (the problem's `detail`).
    pub fn detail(&self) -> String {
        match self {
            Self::KeyRequired => "this endpoint has side effects: send an Idempotency-Key header made from your durable workflow step, the same on every retry".into(),
            Self::InvalidKey(why)
            | Self::InvalidBody(why)
            | Self::Unauthenticated(why)
            | Self::InvalidScope(why) => why.clone(),
            Self::BodyTooLarge { limit } => format!("the request body is over the limit of {limit} bytes"),
            Self::FingerprintMismatch => "this key was first used with a different request (method, path, query string or body); use a new key for a new operation".into(),
            Self::InFlight { stale: false, .. } => format!("the first request with this key is still processing; retry after {} s with the same key", self.retry_after_secs().unwrap_or(1)),
            Self::InFlight { stale: true, .. } => format!("the first request with this key stopped answering and is being reconciled; retry after {} s with the same key", self.retry_after_secs().unwrap_or(1)),
            Self::StoreUnavailable => "the operation was not run; retry later with the same key".into(),
            Self::StoreError => "the operation was not run".into(),
        }
    }

    /// Whether the same request with the same key may succeed later: in flight, or the store
    /// unavailable. Every other refusal needs a changed request (or a fixed store).
    pub fn retry_later(&self) -> bool {
        matches!(self, Self::InFlight { .. } | Self::StoreUnavailable)
    }

    /// When to ask again, where the refusal says ([`InFlight`](Self::InFlight)).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up, at least 1 (HTTP
    /// `Retry-After`).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after()
            .map(|d| d.as_secs_f64().ceil().max(1.0) as u64)
    }
}

/// What the caller of a transport gets for an executor [`Error`]: the operation's own answer
/// (it ran, but its record could not hold that answer as this attempt's) or a [`Refusal`].
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorAnswer<'a> {
    /// The operation ran and answered; the caller gets the answer, since the effect happened:
    /// [`Error::Fenced`] (the newer holder's answer stands in the record),
    /// [`Error::OutcomeTooLarge`] (the record holds "ran, not kept" for retries),
    /// [`Error::NotRecorded`] and [`Error::Encode`] (the record is left to the lease).
    Answer(&'a Outcome),
    /// Nothing ran for this call: refuse. [`Error::InFlight`], [`Error::FingerprintMismatch`],
    /// [`Error::Store`] ([`Refusal::StoreUnavailable`] or [`Refusal::StoreError`] as
    /// [`StoreError::is_unavailable`](crate::StoreError::is_unavailable) says), and
    /// [`Refusal::StoreError`] for the rest (a stored answer that does not decode).
    Refuse(Refusal),
}

impl<'a> ErrorAnswer<'a> {
    /// The answer for `error`.
    pub fn of(error: &'a Error) -> Self {
        match error {
            Error::Fenced { outcome }
            | Error::OutcomeTooLarge { outcome, .. }
            | Error::NotRecorded { outcome, .. }
            | Error::Encode { outcome, .. } => Self::Answer(outcome),
            Error::InFlight { retry_after, stale } => Self::Refuse(Refusal::InFlight {
                retry_after: *retry_after,
                stale: *stale,
            }),
            Error::FingerprintMismatch => Self::Refuse(Refusal::FingerprintMismatch),
            Error::Store(e) if e.is_unavailable() => Self::Refuse(Refusal::StoreUnavailable),
            _ => Self::Refuse(Refusal::StoreError),
        }
    }

    /// [`ErrorAnswer::of`], observed as every transport does: a fingerprint mismatch counted in
    /// `idem_refusals_total{transport}` ([contract §8](crate::contract#observability)), a store
    /// failure logged as a warning and a stored answer that cannot be read as an error. (An
    /// in-flight answer is counted by the executor, as a claim.)
    pub(crate) fn observed(error: &'a Error, transport: &'static str) -> Self {
        let answer = Self::of(error);
        match (&answer, error) {
            (Self::Answer(_), _) | (Self::Refuse(Refusal::InFlight { .. }), _) => {}
            (Self::Refuse(refusal @ Refusal::FingerprintMismatch), _) => {
                crate::metrics::count_refusal(transport, refusal.name());
            }
            (_, Error::Store(e)) => {
                tracing::warn!(error = %e, source = ?std::error::Error::source(e), "store failed before the tool ran");
            }
            (_, other) => tracing::error!(error = %other, "unexpected executor error"),
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreError;

    #[test]
    fn names_and_uris_are_the_contract_s() {
        let all = [
            (Refusal::KeyRequired, "key-required"),
            (Refusal::InvalidKey(String::new()), "invalid-key"),
            (Refusal::InvalidBody(String::new()), "invalid-body"),
            (Refusal::BodyTooLarge { limit: 1 }, "body-too-large"),
            (Refusal::FingerprintMismatch, "fingerprint-mismatch"),
            (
                Refusal::InFlight {
                    retry_after: Duration::from_millis(1500),
                    stale: false,
                },
                "in-flight",
            ),
            (Refusal::StoreUnavailable, "store-unavailable"),
            (Refusal::StoreError, "store-error"),
            (Refusal::Unauthenticated(String::new()), "unauthenticated"),
            (Refusal::InvalidScope(String::new()), "invalid-scope"),
        ];
        for (refusal, name) in all {
            assert_eq!(refusal.name(), name);
            assert_eq!(refusal.type_uri(), format!("urn:idem:problem:{name}"));
        }
    }

    #[test]
    fn store_errors_are_told_apart_and_in_flight_rounds_up() {
        let refusal = |e: &Error| match ErrorAnswer::of(e) {
            ErrorAnswer::Refuse(r) => r,
            other => panic!("a refusal, not {other:?}"),
        };
        let down = Error::Store(StoreError::unavailable("x", "refused"));
        let broken = Error::Store(StoreError::backend("x", "constraint"));
        assert_eq!(refusal(&down), Refusal::StoreUnavailable);
        assert_eq!(refusal(&broken), Refusal::StoreError);
        assert!(refusal(&down).retry_later() && !refusal(&broken).retry_later());
        let busy = refusal(&Error::InFlight {
            retry_after: Duration::from_millis(1001),
            stale: false,
        });
        assert_eq!(busy.retry_after_secs(), Some(2));
        let ran = Error::Fenced {
            outcome: Box::new(Outcome::definitive(200, &1).unwrap()),
        };
        assert!(matches!(ErrorAnswer::of(&ran), ErrorAnswer::Answer(_)));
    }
}
