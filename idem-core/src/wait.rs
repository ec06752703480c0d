//! Waking a request that waits for an in-flight answer ([contract §5.2](crate::contract#waiting)):
//! the [`Timer`] a wait runs on, the portable wait of
//! [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change) (polling
//! [`KeyStore::get`](crate::KeyStore::get) with backoff), and [`Waiters`], the registry of the
//! waits of one process that a store wakes when it hears of a write.
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
//! one record in the process, so a store sees one subscription per record, not one per waiter.
//!
//! Every store of this project keeps its waits in a [`Waiters`]: by [`RecordId`] where every
//! writer is in the process (the memory store, SQLite), by notification payload or channel name
//! where the engine tells it of writes (PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub).
//!
//! A store whose completion can join the caller's transaction (a `complete_in`,
//! [contract §6](crate::contract#transactional-completion)) cannot see that transaction commit.
//! It hands the wake-up it would send after its own commit to [`wake_when_recorded`], which runs
//! it when the caller reports the commit with [`Attempt::mark_recorded`] (as it must anyway), and
//! again when the executor's operation returns. A wake-up that comes early is harmless: the waiter
//! reads the record again and, finding it still `processing`, waits again.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_channel::oneshot;

use crate::{Attempt, RecordId};

pub use crate::store::poll::{changed, poll_every, poll_for_change};
pub use crate::timer::{Sleep, Timer};

/// Leaves `wake` (what the store does after a commit of its own, e.g. [`Waiters::wake`])
/// to run when the transaction that completed `attempt`'s record commits, as the caller reports it
/// with [`Attempt::mark_recorded`]: at once if it already has, else at that call, and once more
/// when [`Executor::run`](crate::Executor::run)'s operation returns. For a store's transactional
/// completion, after it wrote the completion on the caller's transaction. An attempt keeps one:
/// a later call (the caller retried its transaction) replaces it.
pub fn wake_when_recorded(attempt: &Attempt, wake: impl Fn() + Send + Sync + 'static) {
    attempt.wake_when_recorded(Arc::new(wake));
}

/// The waits of one process, by name: a wait [`register`](Waiters::register)s before it reads the
/// record, and whoever learns of a write [`wake`](Waiters::wake)s every wait registered on its
/// name. Clones share the waits.
///
/// The name is what a write is known by: the [`RecordId`] (the default) where every writer is in
/// the process and wakes after its commit, or what the engine's notification carries (a
/// `LISTEN/NOTIFY` payload, a pub/sub channel). A name a wait never hears of, or a wake for
/// nothing, only costs a read: a woken wait reads the record again.
///
/// ```
/// use idem_core::wait::Waiters;
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let waiters: Waiters<String> = Waiters::new();
/// let mut waiter = waiters.register("idem:{a}:k".to_owned()); // before reading the record
/// waiters.wake("idem:{a}:k"); // after a write of it
/// waiter.woken().await;
/// # });
/// ```
pub struct Waiters<N = RecordId> {
    inner: Arc<Mutex<Registry<N>>>,
}

struct Registry<N> {
    next: u64,
    /// The waits on each name; a wait's sender is taken when it is woken, its entry stays until
    /// the wait is dropped.
    names: HashMap<N, HashMap<u64, Option<oneshot::Sender<()>>>>,
}

impl<N> Default for Waiters<N> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Registry {
                next: 0,
                names: HashMap::new(),
            })),
        }
    }
}

impl<N> Clone for Waiters<N> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<N: Eq + Hash> fmt::Debug for Waiters<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiters")
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl<N: Eq + Hash> Waiters<N> {
    /// A registry with no wait.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Registry<N>> {
        // The map stays consistent across a panic: every change is one insert or remove.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a wait on `name`; it is woken by the next [`wake`](Waiters::wake) of `name` or
    /// [`wake_all`](Waiters::wake_all). Register before reading the record, so a write after the
    /// read is never missed. Dropping the [`Waiter`] unregisters it.
    pub fn register(&self, name: N) -> Waiter<N>
    where
        N: Clone,
    {
        let (tx, rx) = oneshot::channel();
        let mut registry = self.lock();
        registry.next += 1;
        let n = registry.next;
        registry
            .names
            .entry(name.clone())
            .or_default()
            .insert(n, Some(tx));
        drop(registry);
        Waiter {
            waiters: self.clone(),
            name,
            n,
            rx,
        }
    }

    /// Wakes every wait registered on `name`.
    pub fn wake<Q>(&self, name: &Q)
    where
        N: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let woken: Vec<_> = match self.lock().names.get_mut(name) {
            Some(waits) => waits.values_mut().filter_map(Option::take).collect(),
            None => return,
        };
        for tx in woken {
            let _ = tx.send(());
        }
    }

    /// Wakes every wait, on every name: after the engine may have lost a notification (a
    /// connection dropped), so that each reads its record again.
    pub fn wake_all(&self) {
        let woken: Vec<_> = self
            .lock()
            .names
            .values_mut()
            .flat_map(|waits| waits.values_mut().filter_map(Option::take))
            .collect();
        for tx in woken {
            let _ = tx.send(());
        }
    }

    /// Whether a wait (woken or not) is registered on `name` and not yet dropped.
    pub fn is_waited<Q>(&self, name: &Q) -> bool
    where
        N: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().names.contains_key(name)
    }

    /// How many waits are registered, on every name.
    pub fn waiting(&self) -> usize {
        self.lock().names.values().map(HashMap::len).sum()
    }
}

/// One wait of a [`Waiters`]: await [`Waiter::woken`]; drop it to unregister.
pub struct Waiter<N: Eq + Hash = RecordId> {
    waiters: Waiters<N>,
    name: N,
    n: u64,
    rx: oneshot::Receiver<()>,
}

impl<N: Eq + Hash> fmt::Debug for Waiter<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

impl<N: Eq + Hash> Waiter<N> {
    /// Resolves at the first wake-up of this wait (at once if it was woken already).
    pub async fn woken(&mut self) {
        // The sender is only dropped unsent when woken, so either way: woken.
        let _ = (&mut self.rx).await;
    }
}

impl<N: Eq + Hash> Drop for Waiter<N> {
    fn drop(&mut self) {
        let mut registry = self.waiters.lock();
        if let Some(waits) = registry.names.get_mut(&self.name) {
            waits.remove(&self.n);
            if waits.is_empty() {
                registry.names.remove(&self.name);
            }
        }
    }
}
