//! The executor's metrics: counting claim and completion answers, and timing store calls.

use std::future::Future;

use crate::{KeyStore, StoreError};

/// Counts one claim answer; `key_source` is the key's [`KeyOrigin`](crate::KeyOrigin) label.
pub(super) fn count_claim(result: &'static str, key_source: &'static str) {
    metrics::counter!(crate::metrics::CLAIMS, "result" => result, "key_source" => key_source)
        .increment(1);
}

/// Counts one completion answer.
pub(super) fn count_completion(result: &'static str) {
    metrics::counter!(crate::metrics::COMPLETIONS, "result" => result).increment(1);
}

/// Times a store call ([`crate::metrics::timed`]).
pub(super) async fn timed<T>(
    store: &dyn KeyStore,
    op: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    crate::metrics::timed(store.backend(), op, call).await
}
