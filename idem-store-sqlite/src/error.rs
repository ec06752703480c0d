//! Error classification: SQLite result codes to [`StoreError`], and the refused table name.

use idem_core::StoreError;
use rusqlite::ErrorCode;

/// Why a table name was refused by [`TableName::new`](crate::TableName::new).
///
/// A table name is spliced into SQL text (SQLite cannot bind identifiers), so only plain
/// identifiers are accepted: an ASCII letter or `_`, then up to 47 ASCII letters, digits or `_`,
/// not starting with `sqlite_` (reserved by SQLite) and not the name of idem's own schema table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// The name was the empty string.
    #[error("invalid table name: it is empty")]
    Empty,
    /// The name was longer than [`TableName::MAX_LEN`](crate::TableName::MAX_LEN) bytes.
    #[error("invalid table name: it is {len} bytes long, the limit is 48")]
    TooLong {
        /// The length given, in bytes.
        len: usize,
    },
    /// The name began with something other than an ASCII letter or `_`.
    #[error("invalid table name: it must begin with an ASCII letter or '_'")]
    BadFirstCharacter,
    /// The name held a character other than an ASCII letter, digit or `_`.
    #[error(
        "invalid table name: character {index} is {ch:?}; only ASCII letters, digits and '_' are allowed"
    )]
    InvalidCharacter {
        /// Byte position of the offending character.
        index: usize,
        /// The offending character.
        ch: char,
    },
    /// The name is reserved (`sqlite_…`, or idem's own schema table).
    #[error("invalid table name: {name:?} is reserved")]
    Reserved {
        /// The name given.
        name: String,
    },
}

/// Maps a rusqlite error to a [`StoreError`] by its SQLite result *code*, never by its message.
///
/// - busy / locked after the busy timeout, I/O failure, cannot open, disk full, out of memory,
///   lock protocol failure: [`StoreError::Unavailable`] (try again later);
/// - a corrupt database file, or a stored value that cannot be read as the schema says:
///   [`StoreError::Corrupt`];
/// - anything else (a constraint, a missing table before `migrate()`, a permission):
///   [`StoreError::Backend`].
pub(crate) fn classify(context: &str, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::OutOfMemory
            | ErrorCode::FileLockingProtocolFailed,
        ) => StoreError::unavailable(format!("sqlite: {context}"), e),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::corrupt_with(
            format!("sqlite: {context}: the database file is damaged ({e})"),
            e,
        ),
        Some(_) => StoreError::backend(format!("sqlite: {context}"), e),
        None => match e {
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..) => StoreError::corrupt_with(
                format!("sqlite: {context}: a stored value does not parse ({e})"),
                e,
            ),
            other => StoreError::backend(format!("sqlite: {context}"), other),
        },
    }
}

/// `.map_err(at("claim"))`.
pub(crate) fn at(context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |e| classify(context, e)
}
