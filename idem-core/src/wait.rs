//! Waking a request that waits for an in-flight answer ([contract §5.2](crate::contract#waiting)):
//! the [`Timer`] a wait runs on, the portable wait of
//! [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change) (polling
//! [`KeyStore::get`](crate::KeyStore::get) with backoff), and [`LocalNotifier`], the in-process
//! wake-up a store can build its own wait from.
//!
//! # For store authors
//!
//! A store that implements nothing new is waited on by polling:
//! [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change)'s default reads the record with
//! [`KeyStore::get`](crate::KeyStore::get) every 5 ms at first, doubling up to every 250 ms, until
//! it differs from the record the waiter saw. A store whose engine can notify overrides
//! `wait_for_change`: subscribe first, then read the record once, return at once if it already
//! differs, else await the notification. Subscribing before the read is what makes a wake-up
//! impossible to lose. The executor shares one call of `wait_for_change` among all the waiters of
//! one (scope, key) in the process, so a store sees one subscription per key, not one per waiter.
//!
//! A store whose completion can join the caller's transaction (a `complete_in`,
//! [contract §6](crate::contract#transactional-completion)) cannot see that transaction commit.
//! It hands the wake-up it would send after its own commit to [`wake_when_recorded`], which runs
//! it when the caller reports the commit with [`Attempt::mark_recorded`] (as it must anyway), and
//! again when the executor's operation returns. A wake-up that comes early is harmless: the waiter
//! reads the record again and, finding it still `processing`, waits again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_channel::oneshot;

use crate::{Attempt, IdempotencyKey, Scope};

pub use crate::store::poll::{changed, poll_every, poll_for_change};
pub use crate::timer::{Sleep, Timer};

/// Leaves `wake` (what the store does after a commit of its own, e.g. [`LocalNotifier::notify`])
/// to run when the transaction that completed `attempt`'s record commits, as the caller reports it
/// with [`Attempt::mark_recorded`]: at once if it already has, else at that call, and once more
/// when [`Executor::run`](crate::Executor::run)'s operation returns. For a store's transactional
/// completion, after it wrote the completion on the caller's transaction. An attempt keeps one:
/// a later call (the caller retried its transaction) replaces it.
pub fn wake_when_recorded(attempt: &Attempt, wake: impl Fn() + Send + Sync + 'static) {
    attempt.wake_when_recorded(Arc::new(wake));
}

type Subscribers = HashMap<(Scope, IdempotencyKey), HashMap<u64, oneshot::Sender<()>>>;

/// In-process wake-ups by (scope, key): a store calls [`LocalNotifier::notify`] after each write
/// (after its commit), and its [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change)
/// awaits a [`LocalNotifier::subscribe`] made before it reads the record. Clones share the
/// subscribers. `MemoryStore` uses it; a store whose writers are all in this process can too.
#[derive(Debug, Clone, Default)]
pub struct LocalNotifier {
    inner: Arc<Mutex<Notifier>>,
}

#[derive(Debug, Default)]
struct Notifier {
    next: u64,
    subscribers: Subscribers,
}

impl LocalNotifier {
    /// A notifier with no subscriber.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Notifier> {
        // The map stays consistent across a panic: every change is one insert or remove.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A subscription to the next [`notify`](Self::notify) of (scope, key). Dropping it
    /// unsubscribes.
    pub fn subscribe(&self, scope: &Scope, key: &IdempotencyKey) -> Subscription {
        let (tx, rx) = oneshot::channel();
        let id = (scope.clone(), key.clone());
        let mut inner = self.lock();
        inner.next += 1;
        let n = inner.next;
        inner
            .subscribers
            .entry(id.clone())
            .or_default()
            .insert(n, tx);
        Subscription {
            notifier: self.clone(),
            id,
            n,
            rx,
        }
    }

    /// Wakes every subscription of (scope, key).
    pub fn notify(&self, scope: &Scope, key: &IdempotencyKey) {
        let woken = self
            .lock()
            .subscribers
            .remove(&(scope.clone(), key.clone()));
        for tx in woken.into_iter().flat_map(HashMap::into_values) {
            let _ = tx.send(());
        }
    }

    /// How many subscriptions are live, on every key.
    pub fn subscriptions(&self) -> usize {
        self.lock().subscribers.values().map(HashMap::len).sum()
    }
}

/// One subscription of a [`LocalNotifier`]: await [`Subscription::notified`]; drop to unsubscribe.
#[derive(Debug)]
pub struct Subscription {
    notifier: LocalNotifier,
    id: (Scope, IdempotencyKey),
    n: u64,
    rx: oneshot::Receiver<()>,
}

impl Subscription {
    /// Resolves at the first notification after the subscription was made.
    pub async fn notified(mut self) {
        // The sender is only dropped unsent when notified, so either way: woken.
        let _ = (&mut self.rx).await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut inner = self.notifier.lock();
        if let Some(key) = inner.subscribers.get_mut(&self.id) {
            key.remove(&self.n);
            if key.is_empty() {
                inner.subscribers.remove(&self.id);
            }
        }
    }
}
