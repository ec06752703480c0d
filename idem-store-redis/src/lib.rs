#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod command;
mod config;
mod conn;
mod connect;
mod durability;
mod error;
mod keys;
mod list;
mod maintenance;
mod purge;
mod purge_scripts;
mod record;
mod reply;
mod scripts;
mod store;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use durability::{InvalidWait, WaitForReplicas};
pub use keys::{BUCKETS, InvalidPrefix, SLICE_MS};
/// The driver this crate is built on, re-exported so callers use the same version.
pub use redis;

use conn::Conn;
use keys::check_prefix;

/// Native expiries at or beyond this many milliseconds are not set (the record is kept until
/// purged): Lua numbers are doubles, exact only below 2^53.
const MAX_NATIVE_TTL_MS: u64 = 1 << 53;

/// A [`KeyStore`](idem_core::KeyStore) on Redis or Redis Cluster.
///
/// - Every operation is one Lua script run with `EVALSHA` (loaded again on `NOSCRIPT`): one round
///   trip, atomic on the server, deciding expiry and leases against the caller's `now`.
/// - A record is one hash; it and its bucket's two index entries share a hash tag, so each
///   script touches one cluster slot. `list_in_flight` and `purge_expired` walk the
///   [`BUCKETS`] per-bucket indexes (no single hot index key).
/// - Native expiry (`PEXPIRE`, relative, `ttl + gc margin`) only collects garbage; it never
///   decides whether a record exists.
///
/// - A request waiting for an in-flight answer is woken by pub/sub: completion, release and
///   takeover publish on the record's channel (`SPUBLISH` on a cluster) when a waiter marked
///   the record, and the store subscribes on one connection of its own, made at the first wait.
///
/// Clones share the connection. See the crate documentation for the layout and the durability
/// trade-offs.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: Arc<str>,
    gc_margin: Duration,
    endpoints: Arc<[String]>,
    wait: Option<WaitForReplicas>,
    waitaof: Arc<durability::WaitAofSupport>,
    hub: Arc<wake::Hub>,
}

impl fmt::Debug for RedisStore {
    // Hand-written: the client's connection info holds the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "mode",
                &if self.is_cluster() {
                    "cluster"
                } else {
                    "standalone"
                },
            )
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("gc_margin", &self.gc_margin)
            .field("wait_for_replicas", &self.wait)
            .finish_non_exhaustive()
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisStore {
    /// The default key prefix: `idem`.
    pub const DEFAULT_PREFIX: &'static str = "idem";
    /// The default garbage-collection margin: one hour past a record's logical expiry.
    pub const DEFAULT_GC_MARGIN: Duration = Duration::from_secs(3600);

    /// The same store with keys under `prefix` instead of `idem` (for several applications on
    /// one server). 1 to 64 bytes of visible ASCII without `{` or `}`. Every handle on the same
    /// records must use the same prefix.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, InvalidPrefix> {
        check_prefix(prefix)?;
        self.prefix = Arc::from(prefix);
        Ok(self)
    }

    /// The same store with a different garbage-collection margin: how long past its logical
    /// expiry (by the writer's clock) the server keeps a record before deleting it natively. It
    /// must exceed the clock skew between the store's callers; the default is one hour.
    pub fn with_gc_margin(mut self, margin: Duration) -> Self {
        self.gc_margin = margin;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the store runs on a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// The native expiry of a record written now with `ttl`, `None` for none.
    fn native_ttl(&self, ttl: Duration) -> Option<u64> {
        let ms = millis(ttl).saturating_add(millis(self.gc_margin));
        (ms < MAX_NATIVE_TTL_MS).then_some(ms)
    }

    /// How many waits are subscribed right now (one per waited key in this process, however
    /// many requests wait on it). For tests.
    #[doc(hidden)]
    pub fn wait_subscriptions(&self) -> usize {
        self.hub.subscriptions()
    }

    /// How many subscriber connections this store (and its clones) made. For tests.
    #[doc(hidden)]
    pub fn subscriber_connections_opened(&self) -> usize {
        self.hub.subscribers_opened()
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }
}
