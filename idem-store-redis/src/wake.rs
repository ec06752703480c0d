//! Waking the requests that wait on a record ([contract §5.2](idem_core::contract#waiting)) with
//! pub/sub.
//!
//! - Writers: the completion, release and claim scripts publish an empty message on the channel
//!   named like the record's key when they complete, release or replace a `processing` record
//!   that a waiter marked (`scripts.rs`): `PUBLISH` on a server, `SPUBLISH` on a cluster (the
//!   channel lives in the key's slot, so the message stays on that shard). A record nobody
//!   waits on publishes nothing.
//! - The mark: a wait, once its subscription is confirmed, sets field `w` of the `processing`
//!   record and reads the record in one script. Redis runs it and the writes one at a time, so
//!   a write before the mark is in what the wait reads, and a write after it publishes to a
//!   subscription that is already there. The write that publishes takes the mark off; a wait
//!   that goes on waiting (a takeover woke it, the record is `processing` again) marks again.
//! - Subscriber: one RESP3 connection per store (shared by its clones), made at the first wait,
//!   whose pushes wake the waits by channel. A wait subscribes to its record's channel (one
//!   subscription per key however many requests wait on it: the executor shares one wait per
//!   key), and reads the record only once the server confirmed it. A channel nobody waits on any
//!   more is unsubscribed by the next subscription (no task runs for it).
//! - A lost connection wakes every wait (the executor reads again) and makes the next wait on a
//!   channel subscribe again. A wait that cannot subscribe polls `get` as the portable wait does,
//!   and a poll every [`SAFETY_POLL`] races each subscribed wait too, for a subscription that
//!   stops hearing without an error. A store made from a caller's [`ConnectionManager`]
//!   ([`RedisStore::from_connection_manager`]) always polls: it has no client to subscribe with.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use idem_core::wait::{Timer, Waiters, changed, poll_every, poll_for_change};
use idem_core::{Clock, KeyStore, Record, RecordId, StoreError, Timestamp};
use redis::aio::ConnectionManager;
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};

use crate::RedisStore;
use crate::command::{evalsha, run};
use crate::keys::RecordKeys;
use crate::record::{self, Fields};
use crate::scripts::MARK_WAITED_SCRIPT;

/// How often a subscribed wait also reads the record, in case its subscription went deaf.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(1);
/// How long a wait waits for its subscription to be confirmed before it polls instead.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a store subscribes with.
#[derive(Clone)]
pub(crate) enum Source {
    /// No client: waits poll.
    None,
    /// A standalone server: this client, set to RESP3.
    Single(Box<redis::Client>),
    /// A cluster: this client (RESP3, or subscriptions fail and waits poll).
    Cluster(Box<ClusterClient>),
}

impl Source {
    /// The standalone client `client`, speaking RESP3 (pushes) for subscribing.
    pub(crate) fn single(client: &redis::Client) -> Self {
        let info = client.get_connection_info().clone();
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        match redis::Client::open(info.set_redis_settings(redis)) {
            Ok(client) => Self::Single(Box::new(client)),
            Err(_) => Self::None,
        }
    }
}

#[derive(Clone)]
enum Subscriber {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The waits of one store and its subscriber.
pub(crate) struct Hub {
    source: Source,
    subscriber: tokio::sync::OnceCell<Subscriber>,
    /// Set when the source cannot subscribe at all (e.g. a cluster client speaking RESP2).
    unable: AtomicBool,
    /// The registered waits, by channel name.
    waiters: Waiters<String>,
    /// The channels the server confirmed a subscription to, since the last disconnection.
    subscribed: Mutex<HashSet<String>>,
    /// Orders subscribe and unsubscribe commands with the decisions that send them.
    order: tokio::sync::Mutex<()>,
    /// How many subscriber connections were made (tests count them).
    opened: AtomicUsize,
}

impl Hub {
    pub(crate) fn new(source: Source) -> Self {
        Self {
            source,
            subscriber: tokio::sync::OnceCell::new(),
            unable: AtomicBool::new(false),
            waiters: Waiters::new(),
            subscribed: Mutex::default(),
            order: tokio::sync::Mutex::new(()),
            opened: AtomicUsize::new(0),
        }
    }

    fn subscribed(&self) -> MutexGuard<'_, HashSet<String>> {
        // The set stays consistent across a panic: every change is one insert or remove.
        self.subscribed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many waits are registered right now, one per waited key.
    pub(crate) fn subscriptions(&self) -> usize {
        self.waiters.waiting()
    }

    /// How many subscriber connections this store made.
    pub(crate) fn subscribers_opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// The subscriber connection, made on the first call; `None` if there is none to be had now.
    async fn subscriber(self: &Arc<Self>) -> Option<Subscriber> {
        if self.unable.load(Ordering::Relaxed) {
            return None;
        }
        let made = self
            .subscriber
            .get_or_try_init(|| async {
                let hub = Arc::downgrade(self);
                let push = move |info: PushInfo| -> Result<(), std::convert::Infallible> {
                    if let Some(hub) = Weak::upgrade(&hub) {
                        hub.on_push(info);
                    }
                    Ok(())
                };
                let made = match &self.source {
                    Source::None => return Err(None),
                    Source::Single(client) => ConnectionManager::new_with_config(
                        (**client).clone(),
                        RedisStore::default_connection_config().set_push_sender(push),
                    )
                    .await
                    .map(Subscriber::Single),
                    Source::Cluster(client) => client
                        .get_async_connection_with_config(
                            ClusterConfig::new().set_push_sender(push),
                        )
                        .await
                        .map(Subscriber::Cluster),
                };
                if made.is_ok() {
                    self.opened.fetch_add(1, Ordering::Relaxed);
                }
                made.map_err(Some)
            })
            .await;
        match made {
            Ok(subscriber) => Some(subscriber.clone()),
            Err(None) => {
                self.unable.store(true, Ordering::Relaxed);
                None
            }
            Err(Some(error)) => {
                if error.kind() == redis::ErrorKind::InvalidClientConfig {
                    self.unable.store(true, Ordering::Relaxed);
                }
                tracing::warn!(%error, "waiting: cannot subscribe; this wait polls");
                None
            }
        }
    }

    fn on_push(&self, info: PushInfo) {
        let channel = || match info.data.first() {
            Some(Value::BulkString(name)) => String::from_utf8(name.clone()).ok(),
            _ => None,
        };
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(name) = channel() {
                    self.wake(&name, false);
                }
            }
            // The server dropped a subscription (a slot moved, or our own unsubscribe): its
            // waits read again and subscribe again.
            PushKind::Unsubscribe | PushKind::SUnsubscribe => {
                if let Some(name) = channel() {
                    self.wake(&name, true);
                }
            }
            PushKind::Disconnection => self.wake_all(),
            _ => {}
        }
    }

    fn wake(&self, name: &str, unsubscribed: bool) {
        if unsubscribed {
            // Our own unsubscribe of a channel nobody waits on is no news.
            if !self.waiters.is_waited(name) {
                return;
            }
            self.subscribed().remove(name);
        }
        self.waiters.wake(name);
    }

    /// After a disconnection: what was published meanwhile is lost, so every wait reads again,
    /// and subscribes again.
    fn wake_all(&self) {
        self.subscribed()
            .retain(|name| !self.waiters.is_waited(name));
        self.waiters.wake_all();
    }

    /// Subscribes to `name` unless it is already; unsubscribes the channels nobody waits on.
    /// Answers whether the subscription is confirmed.
    async fn subscribe(&self, subscriber: &mut Subscriber, name: &str) -> bool {
        let _order = self.order.lock().await;
        let (idle, subscribed) = {
            let mut set = self.subscribed();
            let idle: Vec<String> = set
                .iter()
                .filter(|n| !self.waiters.is_waited(n.as_str()))
                .cloned()
                .collect();
            for n in &idle {
                set.remove(n);
            }
            (idle, set.contains(name))
        };
        let command = async {
            if !idle.is_empty() {
                // Best effort: a channel left subscribed only costs an unused message.
                let _ = match subscriber {
                    Subscriber::Single(c) => c.unsubscribe(&idle).await,
                    Subscriber::Cluster(c) => {
                        for n in &idle {
                            let _ = c.sunsubscribe(n).await;
                        }
                        Ok(())
                    }
                };
            }
            if subscribed {
                return Ok(());
            }
            match subscriber {
                Subscriber::Single(c) => c.subscribe(name).await,
                Subscriber::Cluster(c) => c.ssubscribe(name).await,
            }
        };
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, command).await {
            Ok(Ok(())) => {
                self.subscribed().insert(name.to_owned());
                true
            }
            Ok(Err(error)) => {
                if error.kind() == redis::ErrorKind::InvalidClientConfig {
                    // RESP2: this client cannot subscribe at all.
                    self.unable.store(true, Ordering::Relaxed);
                }
                tracing::debug!(%error, "waiting: subscribe failed; this wait polls");
                false
            }
            Err(_) => false,
        }
    }
}

/// Marks the record `id` as waited on if it is `processing` and reads it, in one script: a write
/// that ends or replaces it after this publishes, one before it is in the answer.
async fn mark_and_get(
    store: &RedisStore,
    id: &RecordId,
    now: Timestamp,
) -> Result<Option<Record>, StoreError> {
    let keys = RecordKeys::new(&store.prefix, id);
    let script = &MARK_WAITED_SCRIPT;
    let fields: Fields = run(script, &evalsha(script, &keys), &mut store.conn(), "wait").await?;
    let names = || Ok((id.scope().as_str().to_owned(), id.key().as_str().to_owned()));
    Ok(record::record(fields, names)?.filter(|r| !r.is_expired(now)))
}

/// [`KeyStore::wait_for_change`] for Redis: register and subscribe, mark and read, then the first of a
/// message and a poll (every [`SAFETY_POLL`] when subscribed, the portable backoff when not).
pub(crate) async fn wait_for_change(
    store: &RedisStore,
    seen: &Record,
    clock: &dyn Clock,
    timer: &Timer,
) -> Result<(), StoreError> {
    let id = seen.id();
    let Some(mut subscriber) = store.hub.subscriber().await else {
        return poll_for_change(store, seen, clock, timer).await;
    };
    let name = RecordKeys::new(&store.prefix, &id).record;
    // Registered before the subscription and the read; dropped, it leaves the channel to be
    // unsubscribed by a later subscription.
    let mut registered = store.hub.waiters.register(name.clone());
    let subscribed = store.hub.subscribe(&mut subscriber, &name).await;
    // Subscribed, the wait marks the record as it reads it, so that the write that ends it
    // publishes (writes publish only for a marked record); polling, it needs no message.
    let now = if subscribed {
        mark_and_get(store, &id, clock.now()).await?
    } else {
        store.get(&id, clock.now()).await?
    };
    if changed(seen, now.as_ref()) {
        return Ok(());
    }
    if subscribed {
        tokio::select! {
            () = registered.woken() => Ok(()),
            polled = poll_every(store, seen, clock, timer, SAFETY_POLL) => polled,
        }
    } else {
        tokio::select! {
            () = registered.woken() => Ok(()),
            polled = poll_for_change(store, seen, clock, timer) => polled,
        }
    }
}
