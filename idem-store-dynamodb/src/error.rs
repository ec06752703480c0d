//! SDK errors as [`StoreError`]s, by the error's kind and DynamoDB's error code (never by message
//! text), and the store's own configuration errors.

use std::error::Error as StdError;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::StoreError;

/// A table name DynamoDB would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// Not 3 to 255 bytes long.
    #[error("a DynamoDB table name is 3 to 255 characters long, this one is {len}")]
    Length {
        /// Its length in bytes.
        len: usize,
    },
    /// A character other than `a-z A-Z 0-9 _ - .`.
    #[error(
        "a DynamoDB table name holds only a-z, A-Z, 0-9, '_', '-' and '.'; {found:?} at byte {index} is none of them"
    )]
    InvalidCharacter {
        /// Where, in bytes.
        index: usize,
        /// The character.
        found: char,
    },
}

/// DynamoDB's codes for "too much right now" and "the service failed": the request changed
/// nothing and may be sent again later.
const TRANSIENT_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
];

/// `err` of request `op` as a [`StoreError`], keeping it as the source: unreachable, timed out or
/// throttled is [`StoreError::Unavailable`]; a missing table is [`StoreError::Misconfigured`]
/// (run `migrate`); anything else is [`StoreError::Backend`].
pub(crate) fn classify<E, R>(op: &'static str, table: &str, err: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("unknown");
            let message = service.err().message().unwrap_or("").to_owned();
            if code == "ResourceNotFoundException" {
                return StoreError::Misconfigured {
                    message: format!(
                        "dynamodb {op}: table {table} not found ({message}); create it with `idem migrate` or the store's migrate()"
                    ),
                };
            }
            let what = format!("dynamodb {op}: {code}: {message}");
            if TRANSIENT_CODES.contains(&code) {
                StoreError::unavailable(what, err)
            } else {
                StoreError::backend(what, err)
            }
        }
        // Not sent, sent without an answer, or an answer that did not parse: the service may
        // be unreachable; a write may or may not have happened (the callers recognise their own
        // write when they read the record back).
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            StoreError::unavailable(format!("dynamodb {op}: {}", source_chain(&err)), err)
        }
        _ => StoreError::backend(format!("dynamodb {op}: {}", source_chain(&err)), err),
    }
}

/// The error and its sources in one line (the SDK's own `Display` says only "dispatch failure").
fn source_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

/// A record item that does not have the shape this crate writes.
pub(crate) fn corrupt(message: impl Into<String>) -> StoreError {
    StoreError::corrupt(format!("dynamodb: {}", message.into()))
}
