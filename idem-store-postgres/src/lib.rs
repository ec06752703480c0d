#![doc = include_str!("../README.md")]

mod batch;
mod config;
mod conflict;
mod error;
mod lane;
mod maintenance;
mod migrate;
mod ops;
mod params;
mod pooler;
mod row;
mod schema;
mod statement;
mod store;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use sqlx::SqlStr;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use error::{InvalidIdentifier, MAX_IDENTIFIER_BYTES};

/// The newest migration this crate knows
/// ([`Maintenance::latest_schema_version`](idem_core::Maintenance::latest_schema_version)).
const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version as u32;
/// How long `PostgresStore::connect`'s pool (and its pooler check) waits for a connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// The driver this crate is built on, re-exported so callers use the same version.
pub use sqlx;

use error::{check_identifier, classify};
use schema::{MIGRATIONS, Statements};

/// A [`KeyStore`](idem_core::KeyStore) keeping records in one PostgreSQL table.
///
/// - A claim reads the record first (one primary-key `SELECT`: a replay is that read alone). A
///   key found absent is inserted (`INSERT … ON CONFLICT DO NOTHING`); when a concurrent claim
///   inserted it first, a separate `SELECT` reads it (a new snapshot, which sees that row:
///   [contract §7](idem_core::contract#traps)). The rules of
///   [`idem_core::machine`] decide; a write they call for (expired record, retry, takeover) is a
///   compare-and-set `UPDATE` that re-reads and retries if the record changed meanwhile. Replays
///   only read. Under load, with batching on, a claim inserts first and reads only a key that
///   exists (below).
/// - `complete`, `release` and `extend` are one fenced `UPDATE` each, run again when the server
///   reports a serialization failure or a deadlock (SQLSTATE 40001, 40P01), as a claim is: a
///   server whose `default_transaction_isolation` is `serializable` loses no outcome.
/// - Claims' inserts and completions that arrive together on one handle share one statement and
///   one commit ([`PostgresStore::with_batching`], on by default); reads are never batched.
/// - [`PostgresStore::complete_in`] completes inside the caller's transaction, so the
///   business write and the record commit together.
/// - Time always comes from the caller's `now`; the server's clock is never consulted.
/// - A request waiting for an in-flight answer is woken by `LISTEN/NOTIFY`: completion, release
///   and takeover notify in their own statement (so at commit), only for a record a waiter
///   marked, and the store listens on one connection of its own, opened at the first wait. See
///   [`PostgresStore::with_notifications`].
/// - Behind a transaction pooler (PgBouncer `pool_mode = transaction`), which the store
///   recognises by itself before its first statement (or at the first prepared-statement
///   collision, after which it runs that statement once more), no statement is prepared: each is
///   one simple-protocol query. See [`PostgresStore::with_transaction_pooler`].
///
/// Clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
    hub: Arc<wake::Hub>,
    notifications: bool,
    /// Prepared or inline statements ([`statement`]), probed for or told ([`pooler`]).
    mode: Arc<pooler::Mode>,
    /// Where `LISTEN` connects, when not on the pool's options.
    listen: Option<Arc<PgConnectOptions>>,
    /// Claims and completions that arrive together share statements ([`batch`]).
    batching: bool,
    batches: Arc<lane::Batches>,
}

impl fmt::Debug for PostgresStore {
    // Hand-written: the pool's options hold the connection string and password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.qualified)
            .field("pool_size", &self.pool.size())
            .field("pool_idle", &self.pool.num_idle())
            .field("notifications", &self.notifications)
            .field("transaction_pooler", &self.mode.inline())
            .field("listen_url", &self.listen.is_some())
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// The default schema: `public`.
    pub const DEFAULT_SCHEMA: &'static str = "public";
    /// The default table: `idem_records`.
    pub const DEFAULT_TABLE: &'static str = "idem_records";

    /// A store on `pool`, in table `public.idem_records`. Call [`PostgresStore::migrate`] once
    /// before use.
    pub fn new(pool: PgPool) -> Self {
        Self::on(
            pool,
            Statements::new(Self::DEFAULT_SCHEMA, Self::DEFAULT_TABLE),
        )
    }

    /// A store on `pool`, in table `schema.table`. Both names must be 1 to
    /// [`MAX_IDENTIFIER_BYTES`] bytes of lower-case ASCII letters, digits and `_`, not starting
    /// with a digit; anything else is refused before any SQL is built.
    pub fn with_table(pool: PgPool, schema: &str, table: &str) -> Result<Self, InvalidIdentifier> {
        check_identifier("schema", schema)?;
        check_identifier("table", table)?;
        Ok(Self::on(pool, Statements::new(schema, table)))
    }

    fn on(pool: PgPool, sql: Statements) -> Self {
        Self {
            pool,
            sql: Arc::new(sql),
            hub: Arc::default(),
            notifications: true,
            mode: Arc::default(),
            listen: None,
            batching: true,
            batches: Arc::default(),
        }
    }

    /// `sql` as a statement the store's connections can run (inline behind a transaction
    /// pooler).
    pub(crate) fn statement<'q>(&self, sql: &SqlStr) -> statement::Statement<'q> {
        statement::Statement::new(sql.clone(), self.mode.inline())
    }

    /// Decides how statements are sent, once, before the first: unless told, probes the server
    /// for a transaction pooler ([`pooler`]) with the pool's connection options (and leaves
    /// `extra_float_digits` out of them if the server refused it).
    pub(crate) async fn ready(&self) {
        self.mode
            .decide(|| async {
                let limit = self.pool.options().get_acquire_timeout();
                let probed = pooler::probe_once(&self.pool.connect_options(), limit).await?;
                if probed.refused_extra_float_digits {
                    let options = (*self.pool.connect_options()).clone();
                    self.pool
                        .set_connect_options(options.extra_float_digits(None));
                }
                Ok(probed.transaction_pooler)
            })
            .await
    }

    /// Says whether the pool's URL points at a transaction pooler (PgBouncer `pool_mode =
    /// transaction`, or a managed pooler that behaves like it), where consecutive transactions of
    /// one connection run on different server connections. Not needed: unless told, the store
    /// finds out before its first statement, with two connections of its own (one server process
    /// seen by two client connections, or one client connection moved to another, is a pooler),
    /// and a prepared statement that collides later (PostgreSQL `26000`, `42P05`, `08P01`: it did
    /// not run) switches it to inline statements and runs again.
    ///
    /// `true`: every statement of the store is sent as one simple-protocol query with its values
    /// written in as typed literals, so no prepared statement outlives its round trip; waits poll
    /// the record unless [`PostgresStore::with_listen_options`] names a direct connection to
    /// `LISTEN` on. The pool's new connections also stop sending the `extra_float_digits` startup
    /// parameter, which PgBouncer refuses unless told to ignore it (`ignore_startup_parameters`);
    /// the store reads no floating-point values. In a URL (see [`PostgresStore::connect`]):
    /// `pooler=transaction`.
    ///
    /// `false`: no probe; prepared statements cached per connection (a direct connection, or
    /// session pooling: `pooler=none` or `pooler=session` in a URL). A collision still switches
    /// the store to inline statements, but a statement of the same name and parameter types can
    /// run in place of another before one does: do not say `false` behind a transaction pooler.
    pub fn with_transaction_pooler(mut self, enabled: bool) -> Self {
        self.mode = Arc::new(pooler::Mode::known(enabled));
        if enabled {
            let options = (*self.pool.connect_options()).clone();
            self.pool
                .set_connect_options(options.extra_float_digits(None));
        }
        self
    }

    /// `LISTEN` on a connection made with `options` (a direct connection to the same server)
    /// rather than on the pool's: behind a transaction pooler, where `LISTEN` cannot be heard,
    /// this lets waiting requests be woken by notification instead of polling. In a URL:
    /// `listen_url=postgres://…` (percent-encoded).
    pub fn with_listen_options(mut self, options: PgConnectOptions) -> Self {
        self.listen = Some(Arc::new(options));
        self
    }

    /// Whether a request waiting for an in-flight answer is woken by `LISTEN` (the default) or
    /// polls the record (`false`). `LISTEN` needs a session of its own, which the store opens on
    /// the pool's connection options (or [`PostgresStore::with_listen_options`]) at the first
    /// wait, outside the pool. Behind a transaction pooler without a direct connection to listen
    /// on, waits poll ([`PostgresStore::with_transaction_pooler`]). Turn it off where one more
    /// connection per process is too many. A listening wait marks the record it waits on, and
    /// every write of a marked record notifies, whichever process makes it; writes of records
    /// nobody waited on do not notify at all (PostgreSQL commits notifying transactions one at a
    /// time).
    pub fn with_notifications(mut self, enabled: bool) -> Self {
        self.notifications = enabled;
        self
    }

    /// Whether the writes of claims and completions that arrive together on this store (and its
    /// clones) share one statement and one commit (`true`, the default). While a batch of a kind
    /// runs, a claim's insert (or a completion) queues, and the next batch takes everything
    /// queued (up to 64): one insert of all those keys, committed before any of them is
    /// answered, or one fenced `UPDATE` of all those records. A write that is alone (nothing
    /// queued, no batch running) runs at once with the unbatched statement: nothing waits for
    /// company. A claim reads first while its kind's lane is idle; while inserts queue or run,
    /// it inserts first, and a key that exists comes back not inserted and is read then. A
    /// claim's read is never batched. Every answer is the one the unbatched store would give: a
    /// key a concurrent claim inserted first, or two writes of one key, go the unbatched way.
    /// `false` runs every write on its own. In a URL (see [`PostgresStore::connect`]):
    /// `batching=off`.
    pub fn with_batching(mut self, enabled: bool) -> Self {
        self.batching = enabled;
        self
    }

    /// How many waits are registered for a notification right now (one per waited key in this
    /// process, however many requests wait on it). For tests.
    #[doc(hidden)]
    pub fn wait_subscriptions(&self) -> usize {
        self.hub.subscriptions()
    }

    /// How many claims and completions ran in a batch with others. For tests.
    #[doc(hidden)]
    pub fn batched_requests(&self) -> u64 {
        self.batches
            .shared
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the store sends its statements inline, as behind a transaction pooler (told,
    /// probed, or switched at a collision). For tests.
    #[doc(hidden)]
    pub fn sends_inline(&self) -> bool {
        self.mode.inline()
    }

    /// How many `LISTEN` connections this store (and its clones) opened. For tests.
    #[doc(hidden)]
    pub fn listen_connections_opened(&self) -> usize {
        self.hub.listeners_opened()
    }

    /// Connects a pool of up to 10 connections to `url` (`postgres://user:pass@host/db`) and
    /// returns a store in table `public.idem_records`. For other settings build the pool yourself
    /// and use [`PostgresStore::new`] or [`PostgresStore::with_table`].
    ///
    /// Before the pool connects, it probes the server for a transaction pooler (see
    /// [`PostgresStore::with_transaction_pooler`]), so a pooler's URL needs no flag: a store that
    /// cannot work there (a pooler in statement mode refuses the probe's transaction) fails here,
    /// not on its requests.
    ///
    /// Three parameters of the URL are the store's, not the driver's:
    /// `pooler=transaction`, `pooler=session` or `pooler=none` (no probe:
    /// [`PostgresStore::with_transaction_pooler`] `true`, or `false`, `session` also dropping the
    /// `extra_float_digits` startup parameter, which PgBouncer refuses by default),
    /// `listen_url=postgres://…` ([`PostgresStore::with_listen_options`]) and `batching=off`
    /// ([`PostgresStore::with_batching`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let url = params::StoreParams::parse(url)?;
        let mut options = if url.pooled {
            url.options.extra_float_digits(None)
        } else {
            url.options
        };
        let inline = match url.pooler {
            Some(told) => told,
            None => {
                let probed = pooler::probe_once(&options, ACQUIRE_TIMEOUT)
                    .await
                    .map_err(refused_probe)?;
                if probed.refused_extra_float_digits {
                    options = options.extra_float_digits(None);
                }
                probed.transaction_pooler
            }
        };
        if inline {
            options = options.extra_float_digits(None);
        }
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| classify("connect", e))?;
        let mut store = Self::new(pool).with_batching(url.batching);
        store.mode = Arc::new(pooler::Mode::known(inline));
        Ok(match url.listen {
            Some(listen) => store.with_listen_options(listen),
            None => store,
        })
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The quoted, schema-qualified table name, e.g. `"public"."idem_records"`.
    pub fn qualified_table(&self) -> &str {
        &self.sql.qualified
    }
}

/// The probe's error, for a store that refuses to start on it.
fn refused_probe(e: pooler::ProbeError) -> StoreError {
    match e {
        pooler::ProbeError::Sql(e) => classify("connect", e),
        pooler::ProbeError::NoTransactions(e) => StoreError::Misconfigured {
            message: format!(
                "postgres connect: the server refused a transaction ({e}): a pooler in statement \
                 mode? idem needs transactions (migrate, complete_in): use pool_mode = transaction \
                 or session, or connect directly"
            ),
        },
    }
}
