//! Waking the requests that wait on a record ([contract §5.2](idem_core::contract#waiting)) with
//! `LISTEN/NOTIFY`: the listener and the waits it wakes (the wait itself is
//! `KeyStore::wait_for_change` in [`crate::store`]).
//!
//! - Writers: completion, release, and a claim that replaces a `processing` record (takeover,
//!   expiry) call `pg_notify(CHANNEL, payload)` in their own statement, so the notification is
//!   delivered when that write commits, and never if it rolls back; and only for a record a
//!   waiter marked (its `waited` column): PostgreSQL commits notifying transactions one at a
//!   time under a database-wide lock, which a deployment where nobody waits does not pay.
//!   `payload` is a 64-bit hash of (table, scope, key) in hex: a collision only wakes a waiter
//!   for nothing, which is allowed. A mark stays (a later attempt's writes notify too).
//!   An extension and a checkpoint do not notify: the record stays `processing`, and the
//!   executor re-reads it anyway when the lease it saw ends.
//! - Listener: one connection per store (shared by its clones, in a pool of its own so it takes
//!   no slot of the store's pool), opened on the first wait, `LISTEN`ing on [`CHANNEL`]; one task
//!   reads it and wakes the waiters by payload. It ends with the last clone of the store. It
//!   connects on the pool's options, or on the direct connection given for it
//!   (`listen_url`); behind a transaction pooler without one, waits poll.
//! - A wait registers its payload while the listener is up (`LISTEN` acknowledged), marks the
//!   record (`UPDATE … SET waited = true`, committed; it waits for a write of the record not yet
//!   committed, such as a `complete_in` in the caller's transaction, and so returns at its
//!   commit), then reads the record: a change committed after that read was made by a write that
//!   saw the mark, and is always delivered. A wait that polls marks nothing. If the connection
//!   drops, every registered wait is woken (the executor reads again), the task reconnects and
//!   `LISTEN`s again, and waits that start meanwhile poll `get` as the portable wait does. A poll
//!   every [`SAFETY_POLL`] races each notified wait too, for a listener that stops hearing
//!   without an error (a half-open connection, or a pooler in transaction mode).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use idem_core::RecordId;
use idem_core::wait::{Waiter, Waiters};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{OnceCell, oneshot};

/// The channel every store notifies and listens on (the payload names the table).
pub(crate) const CHANNEL: &str = "idem_changes";
/// How often a wait woken by notification also reads the record, in case the listener went deaf.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(1);
/// The longest pause between two attempts to open the listener.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The notification payload of the record `id` in `table`: FNV-1a 64 of (table, scope, key) in
/// 16 hex digits, stable across versions and platforms (every process computes it alike).
pub(crate) fn payload(table: &str, id: &RecordId) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [
        table.as_bytes(),
        id.scope().as_str().as_bytes(),
        id.key().as_str().as_bytes(),
    ] {
        for &b in part.iter().chain(&[0x1f]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The waits of one store and its listener's state.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    /// The registered waits, by payload.
    waiters: Waiters<String>,
    /// Whether the listener is `LISTEN`ing now: set before every wait is woken, read after a
    /// wait registers, so a wait that read a stale value is woken and reads again.
    up: AtomicBool,
    /// Set once the listener task runs and has made its first attempt.
    started: OnceCell<()>,
    /// Dropped with the hub: the listener task ends.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// How many listener connections were opened (tests count them).
    opened: AtomicUsize,
}

impl Hub {
    /// How many waits are registered right now.
    pub(crate) fn subscriptions(&self) -> usize {
        self.waiters.waiting()
    }

    /// How many listener connections this store opened.
    pub(crate) fn listeners_opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// Starts the listener task on the first call, connecting with `options`; returns once it
    /// has tried to `LISTEN` once.
    pub(crate) async fn start(self: &Arc<Self>, options: &PgConnectOptions) {
        self.started
            .get_or_init(|| async {
                let (ready, first) = oneshot::channel();
                let (stop, stopped) = oneshot::channel();
                *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(stop);
                // Its own pool of one connection.
                let listen_pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy_with(options.clone());
                tokio::spawn(listen(Arc::downgrade(self), listen_pool, stopped, ready));
                let _ = first.await;
            })
            .await;
    }

    /// Registers a wait on `payload`; also answers whether the listener is up.
    pub(crate) fn register(&self, payload: String) -> (Waiter<String>, bool) {
        let waiter = self.waiters.register(payload);
        (waiter, self.up.load(Ordering::SeqCst))
    }

    fn wake(&self, payload: &str) {
        self.waiters.wake(payload);
    }

    /// Sets whether the listener is up and wakes every wait: what they wait on may have been
    /// missed (down), or can now be heard (up).
    fn wake_all(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        self.waiters.wake_all();
    }
}

/// The listener task: (re)connects and `LISTEN`s, then wakes waits by payload until the hub is
/// dropped.
async fn listen(
    hub: Weak<Hub>,
    pool: PgPool,
    mut stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut pause = Duration::from_millis(100);
    loop {
        let connect = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let connected = tokio::select! {
            _ = &mut stop => return,
            connected = connect => connected,
        };
        let Some(strong) = hub.upgrade() else { return };
        match connected {
            Ok(mut listener) => {
                strong.opened.fetch_add(1, Ordering::Relaxed);
                strong.wake_all(true);
                drop(strong);
                ready.take().map(|r| r.send(()));
                pause = Duration::from_millis(100);
                let error = loop {
                    let received = tokio::select! {
                        _ = &mut stop => return,
                        received = listener.try_recv() => received,
                    };
                    let Some(hub) = hub.upgrade() else { return };
                    match received {
                        Ok(Some(notification)) => hub.wake(notification.payload()),
                        // The connection dropped; the listener reconnected and `LISTEN`s again,
                        // but what was sent meanwhile is lost: every wait reads again.
                        Ok(None) => hub.wake_all(true),
                        Err(error) => break error,
                    }
                };
                tracing::warn!(%error, "waiting: the LISTEN connection failed; waits poll until it is back");
            }
            Err(error) => {
                drop(strong);
                tracing::warn!(%error, "waiting: could not LISTEN; waits poll until it can");
            }
        }
        if let Some(hub) = hub.upgrade() {
            hub.wake_all(false);
        }
        ready.take().map(|r| r.send(()));
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}
