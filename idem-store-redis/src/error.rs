//! Redis errors as [`StoreError`]s, by the driver's error kind (never by message text).

use idem_core::StoreError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Whether `err` means "the server cannot be reached or cannot serve right now".
pub(crate) fn is_transient(err: &RedisError) -> bool {
    match err.kind() {
        // Connection refused / reset / closed, I/O and response timeouts.
        ErrorKind::Io
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown
            // A write reached a replica: a failover is under way.
            | ServerErrorKind::ReadOnly
            // Redirects the client could not follow within its retries: resharding is under way.
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => true,
        // Codes the driver does not name: OOM (memory full, writes refused until it frees) and
        // BUSY (another script is running too long) pass with time.
        ErrorKind::Extension => matches!(err.code(), Some("OOM" | "BUSY")),
        _ => err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal(),
    }
}

/// `err` as a [`StoreError`] for operation `op`, keeping it as the source.
pub(crate) fn classify(op: &'static str, err: RedisError) -> StoreError {
    if is_transient(&err) {
        // The driver's text says why (refused, reset, a certificate not trusted).
        StoreError::unavailable(format!("redis {op}: {} ({err})", err.category()), err)
    } else {
        StoreError::backend(format!("redis {op}: {}", err.category()), err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(classify("claim", io).is_unavailable());
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(classify("claim", loading).is_unavailable());
        let down = RedisError::from((ErrorKind::Server(ServerErrorKind::ClusterDown), "down"));
        assert!(classify("claim", down).is_unavailable());
        let syntax =
            RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "syntax"));
        assert!(matches!(
            classify("claim", syntax),
            StoreError::Backend { .. }
        ));
        let wrongtype = RedisError::from((ErrorKind::UnexpectedReturnType, "wrongtype"));
        assert!(!classify("get", wrongtype).is_unavailable());
    }
}
