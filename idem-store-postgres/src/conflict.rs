//! Statements that run again: after a serialization failure or a deadlock, with a random backoff;
//! once, inline, after a prepared-statement collision (a transaction pooler: [`crate::pooler`]).

use std::time::Duration;

use idem_core::StoreError;

use crate::error::classify;
use crate::error::is_transient_conflict;
use crate::pooler::Mode;

/// How many times a claim re-reads and retries when the record changes under it (another claim,
/// a completion, a purge) or the server reports a serialization conflict, before giving up with
/// [`StoreError::Unavailable`].
pub(crate) const MAX_CLAIM_ROUNDS: usize = 16;

/// How many times `complete`, `release` and `extend` run their statement while the server answers
/// with a serialization failure or a deadlock (SQLSTATE 40001, 40P01), before giving up with
/// [`StoreError::Unavailable`].
pub(crate) const MAX_CONFLICT_RETRIES: usize = 16;

/// Runs `statement` (one autocommit statement on the pool, or a transaction of its own, built
/// anew with `mode` at each call) again while the server reports a serialization failure or a
/// deadlock: the server rolled the statement back, so running it again is exactly one attempt
/// more (a server whose `default_transaction_isolation` is `serializable` or `repeatable read`
/// raises 40001 when a concurrent writer committed to the row after the statement's snapshot).
/// A prepared statement that collided behind a transaction pooler did not run either: it runs
/// again, inline ([`Mode::collided`]). Codes by SQLSTATE, never by message text.
pub(crate) async fn retry_conflicts<T, F, Fut>(
    mode: &Mode,
    op: &'static str,
    mut statement: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    for round in 1..=MAX_CONFLICT_RETRIES {
        let inline = mode.inline();
        match statement().await {
            Ok(value) => return Ok(value),
            Err(e) if mode.collided(inline, &e) => {}
            Err(e) if is_transient_conflict(&e) => {
                tracing::debug!(op, round, error = %e, "serialization conflict; running the statement again");
                conflict_backoff(round).await;
            }
            Err(e) => return Err(classify(op, e)),
        }
    }
    tracing::warn!(
        op,
        "gave up after {MAX_CONFLICT_RETRIES} serialization conflicts in a row"
    );
    Err(StoreError::Unavailable {
        message: format!(
            "postgres {op}: {MAX_CONFLICT_RETRIES} serialization conflicts in a row; try again"
        ),
        source: None,
    })
}

/// Waits a random 0..=min(2^round, 50) ms before running a conflicting statement again: under
/// SERIALIZABLE, conflicts also come from neighbouring rows (predicate locks on index pages), and
/// statements that collided collide again if they all retry at once.
pub(crate) async fn conflict_backoff(round: usize) {
    let cap = 1u64 << round.min(6);
    let ms = rand::random_range(0..=cap.min(50));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A decode failure we raised ourselves carries a `StoreError::Corrupt`: hand it back as it is.
pub(crate) fn claim_error(err: sqlx::Error) -> StoreError {
    match err {
        sqlx::Error::Decode(inner) => match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => classify("claim", sqlx::Error::Decode(other)),
        },
        other => classify("claim", other),
    }
}
