//! Waking the requests that wait on a record ([contract §5.2](idem_core::contract#waiting)): a
//! write by this process wakes them at once (one in-process notifier per database file), a
//! completion in a caller's own transaction when the caller reports its commit
//! ([`Attempt::mark_recorded`](idem_core::Attempt::mark_recorded)), and a poll of the record
//! catches the writes of other processes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use idem_core::wait::{LocalNotifier, Timer, changed, poll_for_change};
use idem_core::{Clock, KeyStore, Record, StoreError};

use crate::SqliteStore;

/// The notifier of the database file at `path` (canonical), shared by every store of this
/// process opened on it. Kept for the life of the process: an empty notifier is one empty map.
pub(crate) fn file_notifier(path: PathBuf) -> LocalNotifier {
    static NOTIFIERS: OnceLock<Mutex<HashMap<PathBuf, LocalNotifier>>> = OnceLock::new();
    NOTIFIERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path)
        .or_default()
        .clone()
}

/// [`KeyStore::wait_for_change`] for SQLite: subscribe, read, then the first of a notification
/// from this process and a poll that sees a change.
pub(crate) async fn wait_for_change(
    store: &SqliteStore,
    seen: &Record,
    clock: &dyn Clock,
    timer: &Timer,
) -> Result<(), StoreError> {
    let (scope, key) = (&seen.scope, &seen.key);
    let subscription = store.inner.notifier.subscribe(scope, key);
    if changed(seen, store.get(scope, key, clock.now()).await?.as_ref()) {
        return Ok(());
    }
    tokio::select! {
        () = subscription.notified() => Ok(()),
        polled = poll_for_change(store, seen, clock, timer) => polled,
    }
}
