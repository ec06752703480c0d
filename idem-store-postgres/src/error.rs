//! Turning sqlx errors into [`StoreError`]s, by SQLSTATE code and error kind, never by message
//! text.

use idem_core::StoreError;

/// A schema or table name that cannot be used as a PostgreSQL identifier.
///
/// Names are checked before any SQL is built from them: 1 to 48 bytes of lower-case ASCII
/// letters, digits and `_`, not starting with a digit (48 leaves room for the derived index and
/// migration-table names within PostgreSQL's 63-byte limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} name {name:?}: {reason}")]
pub struct InvalidIdentifier {
    /// `"schema"` or `"table"`.
    pub what: &'static str,
    /// The name that was refused.
    pub name: String,
    /// Which rule it broke.
    pub reason: &'static str,
}

impl From<InvalidIdentifier> for StoreError {
    fn from(e: InvalidIdentifier) -> Self {
        StoreError::Misconfigured {
            message: e.to_string(),
        }
    }
}

/// The longest schema or table name accepted, in bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 48;

pub(crate) fn check_identifier(what: &'static str, name: &str) -> Result<(), InvalidIdentifier> {
    let refuse = |reason| {
        Err(InvalidIdentifier {
            what,
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_IDENTIFIER_BYTES {
        return refuse("it is longer than 48 bytes");
    }
    if name.as_bytes()[0].is_ascii_digit() {
        return refuse("it starts with a digit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return refuse("only lower-case ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

/// SQLSTATE classes and codes that mean "the server cannot serve us right now": connection
/// exceptions (08), insufficient resources (53: too many connections, out of memory, disk full) and
/// the shutdown family (57P01 admin shutdown / `pg_terminate_backend`, 57P02 crash shutdown,
/// 57P03 cannot connect now).
fn code_means_unavailable(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("53") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Serialization failure or deadlock: the statement can simply be run again.
pub(crate) fn is_transient_conflict(err: &sqlx::Error) -> bool {
    matches!(sqlstate(err).as_deref(), Some("40001" | "40P01"))
}

pub(crate) fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Classifies `err`, raised while doing `op`.
pub(crate) fn classify(op: &'static str, err: sqlx::Error) -> StoreError {
    let code = sqlstate(&err);
    if matches!(code.as_deref(), Some("26000" | "42P05")) {
        // A prepared statement made on another server connection: a transaction pooler the store
        // was told is not there (`crate::pooler`). It did not run; running it again may succeed.
        return StoreError::unavailable(
            format!(
                "postgres {op}: a prepared statement collided ({err}): a transaction pooler is in \
                 the path; leave pooler= out of the URL (or say pooler=transaction)"
            ),
            err,
        );
    }
    let unavailable = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => code.as_deref().is_some_and(code_means_unavailable),
        _ => false,
    };
    if unavailable {
        // The driver's text says why (refused, reset, a certificate not trusted, TLS missing).
        return StoreError::unavailable(
            format!("postgres {op}: connection unavailable ({err})"),
            err,
        );
    }
    if is_transient_conflict(&err) {
        // Reached only where the statement cannot simply run again (inside the caller's
        // transaction): the caller retries its transaction.
        return StoreError::unavailable(
            format!("postgres {op}: serialization failure or deadlock; retry the transaction"),
            err,
        );
    }
    match (code.as_deref(), &err) {
        // undefined_table, undefined_column, invalid_schema_name: the schema is not migrated.
        (Some("42P01" | "42703" | "3F000"), _) => StoreError::Misconfigured {
            message: format!(
                "postgres {op}: the idem table or one of its columns is missing; run PostgresStore::migrate() ({err})"
            ),
        },
        (_, sqlx::Error::ColumnNotFound(_)) => StoreError::Misconfigured {
            message: format!(
                "postgres {op}: unexpected table shape; run PostgresStore::migrate() ({err})"
            ),
        },
        (_, sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => StoreError::corrupt(
            format!("postgres {op}: a stored value could not be decoded: {err}"),
        ),
        _ => StoreError::backend(format!("postgres {op} failed"), err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(check_identifier("table", "idem_records").is_ok());
        assert!(check_identifier("table", "_x9").is_ok());
        for bad in ["", "9a", "Upper", "a-b", "a b", "a\"b", "a;drop", "é"] {
            let e = check_identifier("schema", bad).unwrap_err();
            assert_eq!(e.what, "schema");
        }
        assert!(check_identifier("table", &"a".repeat(48)).is_ok());
        assert!(check_identifier("table", &"a".repeat(49)).is_err());
    }

    #[test]
    fn classification_by_kind() {
        assert!(classify("claim", sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(classify("claim", sqlx::Error::PoolClosed).is_unavailable());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(classify("claim", sqlx::Error::Io(io)).is_unavailable());
        assert_eq!(
            classify("claim", sqlx::Error::RowNotFound).kind(),
            "backend"
        );
        for code in ["08006", "08001", "53300", "57P01", "57P02", "57P03"] {
            assert!(code_means_unavailable(code), "{code}");
        }
        for code in ["23505", "40001", "42P01", "57014", "22003"] {
            assert!(!code_means_unavailable(code), "{code}");
        }
    }
}
