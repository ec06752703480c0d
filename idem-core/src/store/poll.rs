//! The portable wait, [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change)'s default
//! (re-exported from [`crate::wait`]).

use std::time::Duration;

use crate::timer::Timer;
use crate::{Clock, KeyStore, Record, StoreError};

/// The first pause of the portable wait.
pub(crate) const POLL_FIRST: Duration = Duration::from_millis(5);
/// The longest pause of the portable wait.
pub(crate) const POLL_MAX: Duration = Duration::from_millis(250);

/// Whether `now` differs from `seen` in anything a waiter acts on: gone, another state, another
/// holder, another lease.
pub fn changed(seen: &Record, now: Option<&Record>) -> bool {
    now.is_none_or(|r| {
        (r.state, r.token, r.lease_until, r.updated_at)
            != (seen.state, seen.token, seen.lease_until, seen.updated_at)
    })
}

/// The portable wait, [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change)'s default:
/// reads the record with `get` after 5 ms, then after pauses doubling up to 250 ms, until it
/// [`changed`] from `seen`.
pub async fn poll_for_change<S: KeyStore + ?Sized>(
    store: &S,
    seen: &Record,
    clock: &dyn Clock,
    timer: &Timer,
) -> Result<(), StoreError> {
    let mut pause = POLL_FIRST;
    loop {
        timer.sleep(pause).await;
        if read_changed(store, seen, clock).await? {
            return Ok(());
        }
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// Reads the record with `get` every `every` until it [`changed`] from `seen`: the safety poll a
/// store with notifications races its notification against, so a wake-up lost by the engine (a
/// half-open connection, a pooler that drops `LISTEN`) costs at most `every`.
pub async fn poll_every<S: KeyStore + ?Sized>(
    store: &S,
    seen: &Record,
    clock: &dyn Clock,
    timer: &Timer,
    every: Duration,
) -> Result<(), StoreError> {
    loop {
        timer.sleep(every).await;
        if read_changed(store, seen, clock).await? {
            return Ok(());
        }
    }
}

/// One read of the record (timed as the store's `get`): whether it [`changed`] from `seen`.
async fn read_changed<S: KeyStore + ?Sized>(
    store: &S,
    seen: &Record,
    clock: &dyn Clock,
) -> Result<bool, StoreError> {
    let found =
        crate::metrics::timed(store.backend(), "get", store.get(&seen.id(), clock.now())).await?;
    Ok(changed(seen, found.as_ref()))
}
