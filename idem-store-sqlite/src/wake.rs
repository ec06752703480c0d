//! Waking the requests that wait on a record ([contract §5.2](idem_core::contract#waiting)): a
//! write by this process wakes them at once (one in-process registry of waits per database file), a
//! completion in a caller's own transaction when the caller reports its commit
//! ([`Attempt::mark_recorded`](idem_core::Attempt::mark_recorded)), and a poll of the record
//! catches the writes of other processes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use idem_core::wait::{Timer, Waiters, changed, poll_for_change};
use idem_core::{Clock, KeyStore, Record, StoreError};

use crate::SqliteStore;

/// The waits on the database file at `path` (canonical), shared by every store of this process
/// opened on it. Kept for the life of the process: an empty registry is one empty map.
pub(crate) fn file_waiters(path: PathBuf) -> Waiters {
    static WAITERS: OnceLock<Mutex<HashMap<PathBuf, Waiters>>> = OnceLock::new();
    WAITERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path)
        .or_default()
        .clone()
}

/// [`KeyStore::wait_for_change`] for SQLite: register, read, then the first of a wake-up from
/// this process and a poll that sees a change.
pub(crate) async fn wait_for_change(
    store: &SqliteStore,
    seen: &Record,
    clock: &dyn Clock,
    timer: &Timer,
) -> Result<(), StoreError> {
    let id = seen.id();
    let mut waiter = store.inner.waiters.register(id.clone());
    if changed(seen, store.get(&id, clock.now()).await?.as_ref()) {
        return Ok(());
    }
    tokio::select! {
        () = waiter.woken() => Ok(()),
        polled = poll_for_change(store, seen, clock, timer) => polled,
    }
}
