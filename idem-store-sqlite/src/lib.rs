#![doc = include_str!("../README.md")]

mod error;
mod row;
mod schema;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use idem_core::machine::{
    self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer, Transition,
};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, Policy, Record, Scope, StoreError,
    Timestamp, Token, async_trait,
};
use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};
use tokio::sync::Semaphore;

pub use error::TableNameError;
pub use rusqlite;
pub use schema::{SCHEMA_TABLE, SCHEMA_VERSION, TableName};

use error::at;

/// How hard SQLite pushes each commit to disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL`, the default: a commit (a claim, a completion) is on disk before it returns, and
    /// survives a power loss or an OS crash.
    #[default]
    Full,
    /// `NORMAL`: in WAL mode a commit survives the application crashing, but the last commits
    /// before a **power loss or OS crash** can be lost. A lost claim whose effect already happened
    /// means the retry runs the effect again: a double effect. Opt in only where the disk or the
    /// operation makes that acceptable.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// Settings of a [`SqliteStore`]; start from [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    table: TableName,
    synchronous: Synchronous,
    busy_timeout: Duration,
    max_connections: usize,
}

impl SqliteStoreBuilder {
    /// The table the records live in (default [`TableName::DEFAULT`], `idem_records`).
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// Validates `name` and makes it the table; refused with a [`TableNameError`].
    pub fn table_name(self, name: &str) -> Result<Self, TableNameError> {
        Ok(self.table(TableName::new(name)?))
    }

    /// Durability of each commit (default [`Synchronous::Full`]; read [`Synchronous::Normal`]
    /// before choosing it).
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// How long a statement waits for another connection's or process's write lock before the
    /// operation fails with [`StoreError::Unavailable`] (default 10 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How many connections this handle keeps and uses at once (default 4, at least 1).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Opens (creating if needed) the database file and one connection, checking the settings.
    /// Does not create the table: call [`SqliteStore::migrate`].
    pub fn open(self) -> Result<SqliteStore, StoreError> {
        let config = Config {
            path: self.path,
            synchronous: self.synchronous,
            busy_timeout: self.busy_timeout,
        };
        let first = config.connect()?;
        // One write lock per database file per process (see `Inner::write_lock`).
        let canonical = std::fs::canonicalize(&config.path).unwrap_or_else(|_| config.path.clone());
        let inner = Inner {
            sql: schema::Sql::new(&self.table),
            table: self.table,
            config,
            max_connections: self.max_connections,
            idle: Mutex::new(vec![first]),
            permits: Arc::new(Semaphore::new(self.max_connections)),
            writer: file_write_lock(canonical),
        };
        Ok(SqliteStore {
            inner: Arc::new(inner),
        })
    }
}

/// How every connection of a store is opened.
struct Config {
    path: PathBuf,
    synchronous: Synchronous,
    busy_timeout: Duration,
}

impl Config {
    fn connect(&self) -> Result<Connection, StoreError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(at("open"))?;
        conn.busy_timeout(self.busy_timeout)
            .map_err(at("busy_timeout"))?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(at("journal_mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Misconfigured {
                message: format!(
                    "sqlite: {} cannot use WAL (journal_mode is {mode}); open a file on a local disk",
                    self.path.display()
                ),
            });
        }
        conn.pragma_update(None, "synchronous", self.synchronous.pragma())
            .map_err(at("synchronous"))?;
        Ok(conn)
    }
}

/// A [`KeyStore`] in an SQLite database file: the embedded default, no server needed.
///
/// - Every operation is one transaction; those that write run `BEGIN IMMEDIATE` → read the record
///   → decide with the pure rules of [`idem_core::machine`] → write → `COMMIT`, so they are atomic
///   across threads, connections and OS processes sharing the file (one host only: WAL does not
///   work on network file systems).
/// - A claim that only reads (replay, in flight, mismatch) decides from one `SELECT` and takes no
///   write lock: replays run in parallel.
/// - The blocking SQLite calls run on tokio's blocking pool (`spawn_blocking`), over a small pool
///   of connections per handle; a tokio runtime is required.
/// - Clones share the same connections. Each [`SqliteStore::open`] is a new handle with its own.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    table: TableName,
    sql: schema::Sql,
    max_connections: usize,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
    writer: Arc<Mutex<()>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        f.debug_struct("SqliteStore")
            .field("path", &c.path)
            .field("table", &self.inner.table.as_str())
            .field("synchronous", &c.synchronous)
            .field("busy_timeout", &c.busy_timeout)
            .field("max_connections", &self.inner.max_connections)
            .finish()
    }
}

/// The process-wide write lock of a database file. Within one process, writers queue on it
/// (first come, first served, no timeout), so SQLite's busy handler (which polls with sleeps and
/// gives up after the busy timeout) only arbitrates between processes.
fn file_write_lock(path: PathBuf) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(lock) = locks.get(&path).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, weak| weak.strong_count() > 0);
    let lock = Arc::new(Mutex::new(()));
    locks.insert(path, Arc::downgrade(&lock));
    lock
}

impl Inner {
    fn write_lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic while holding it leaves nothing half-done.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_connection(&self) -> Result<Connection, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => self.config.connect(),
        }
    }

    fn give_back(&self, conn: Connection) {
        // A connection left inside a transaction (it cannot be after our own calls, which commit
        // or roll back) would poison the next user: drop it instead.
        if conn.is_autocommit() {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
    }

    /// Runs `f` in an `IMMEDIATE` transaction (after the process-wide write lock) and commits.
    fn write_tx<A>(
        &self,
        conn: &Connection,
        f: impl FnOnce(&Connection) -> Result<A, StoreError>,
    ) -> Result<A, StoreError> {
        let _writer = self.write_lock();
        let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
            .map_err(at("begin immediate"))?;
        let answer = f(&tx)?;
        tx.commit().map_err(at("commit"))?;
        Ok(answer)
    }

    /// Reads the record, applies `rule`, writes its result: the body of every write operation.
    fn apply<A>(
        &self,
        conn: &Connection,
        scope: &Scope,
        key: &IdempotencyKey,
        rule: impl FnOnce(Option<&Record>) -> Result<Transition<A>, StoreError>,
    ) -> Result<A, StoreError> {
        let found = row::read(conn, &self.sql, scope, key)?;
        let transition = rule(found.as_ref())?;
        if let Some(record) = &transition.write {
            row::write(conn, &self.sql, record, found.as_ref())?;
        }
        Ok(transition.answer)
    }
}

impl SqliteStore {
    /// Opens the database file at `path` (created if missing) with the default settings:
    /// table `idem_records`, WAL, `synchronous=FULL`, 10 s busy timeout, up to 4 connections.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).open()
    }

    /// A builder for a store on `path`, starting from the defaults of [`SqliteStore::open`].
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            table: TableName::default(),
            synchronous: Synchronous::default(),
            busy_timeout: Duration::from_secs(10),
            max_connections: 4,
        }
    }

    /// Creates or upgrades the table to [`SCHEMA_VERSION`]. Idempotent, and safe to run from
    /// several processes at once (one `BEGIN IMMEDIATE` transaction). Blocking: call it at
    /// start-up.
    pub fn migrate(&self) -> Result<(), StoreError> {
        let conn = self.inner.take_connection()?;
        let result = {
            let _writer = self.inner.write_lock();
            schema::migrate(&conn, &self.inner.table)
        };
        self.inner.give_back(conn);
        result.map(|_| ())
    }

    /// The schema version of the store's table as recorded in [`SCHEMA_TABLE`], without changing
    /// anything: 0 when it was never migrated. Anything below [`SCHEMA_VERSION`] needs
    /// [`SqliteStore::migrate`] (by a role allowed to change the schema) before the store is
    /// used; above it, a newer library migrated the file. Blocking.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        let conn = self.inner.take_connection()?;
        let result = schema::version(&conn, &self.inner.table);
        self.inner.give_back(conn);
        result
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.config.path
    }

    /// The records table.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// A new connection to the same file with the store's settings (WAL, `synchronous`, busy
    /// timeout), for the caller's own transactions (see [`SqliteStore::complete_in`]).
    pub fn connection(&self) -> Result<Connection, StoreError> {
        self.inner.config.connect()
    }

    /// Runs `f` with one of the store's pooled connections on tokio's blocking pool: the place for
    /// a transaction that writes the effect and calls [`SqliteStore::complete_in`].
    pub async fn with_connection<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.run(move |_, conn| Ok(f(conn))).await
    }

    /// Completes the claim of `token` inside the caller's transaction `conn`, per
    /// [`idem_core::machine::complete`], without committing: the caller's effect and the
    /// completion commit together or not at all.
    ///
    /// Begin the transaction with [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior)
    /// (a deferred transaction that reads then writes can fail with `SQLITE_BUSY` whatever the busy
    /// timeout). Refused with [`StoreError::Misconfigured`] outside a transaction. If the answer is
    /// [`CompleteAnswer::Fenced`], nothing was written for the record: roll the transaction back,
    /// so the effect does not happen either. Blocking.
    // The arguments of `KeyStore::complete`, plus the caller's connection.
    #[allow(clippy::too_many_arguments)]
    pub fn complete_in(
        &self,
        conn: &Connection,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        if conn.is_autocommit() {
            return Err(StoreError::Misconfigured {
                message: "sqlite: complete_in needs an open transaction on the connection".into(),
            });
        }
        self.inner.apply(conn, scope, key, |found| {
            Ok(machine::complete(found, token, outcome, now, policy)?)
        })
    }

    /// Runs `f` on a pooled connection on tokio's blocking pool. At most `max_connections` at
    /// once per handle; the connection goes back to the pool unless the store was unavailable.
    async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Inner, &mut Connection) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::backend("sqlite: connection pool closed", e))?;
        let inner = self.inner.clone();
        // If the caller's future is dropped, the blocking call still finishes (and commits): a
        // claim made that way is left to its lease, as idem_core::contract §2 says of cancellation.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut conn = inner.take_connection()?;
            let result = f(&inner, &mut conn);
            if !matches!(result, Err(StoreError::Unavailable { .. })) {
                inner.give_back(conn);
            }
            result
        })
        .await
        .map_err(|e| {
            if e.is_cancelled() {
                // The runtime is shutting down: the store is not there to answer, try again.
                StoreError::unavailable("sqlite: the blocking task was cancelled", e)
            } else {
                StoreError::backend("sqlite: the blocking task panicked", e)
            }
        })?
    }
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let (scope, key, fingerprint, policy) =
            (scope.clone(), key.clone(), fingerprint.clone(), *policy);
        self.run(move |inner, conn| {
            let req = ClaimRequest::new(&scope, &key, &fingerprint);
            // Read-only answers (replay, in flight, mismatch) are decided from one SELECT, which
            // sees one committed state: no write lock, so replays do not queue behind writers.
            let found = row::read(conn, &inner.sql, &scope, &key)?;
            let first = machine::claim(found.as_ref(), req, now, &policy);
            if first.write.is_none() {
                return Ok(first.answer);
            }
            // A claim that writes reads and decides again under the write lock.
            inner.write_tx(conn, |tx| {
                inner.apply(tx, &scope, &key, |found| {
                    Ok(machine::claim(found, req, now, &policy))
                })
            })
        })
        .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        let (scope, key, outcome, policy) = (scope.clone(), key.clone(), outcome.clone(), *policy);
        self.run(move |inner, conn| {
            inner.write_tx(conn, |tx| {
                inner.apply(tx, &scope, &key, |found| {
                    Ok(machine::complete(found, token, &outcome, now, &policy)?)
                })
            })
        })
        .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let (scope, key) = (scope.clone(), key.clone());
        self.run(move |inner, conn| {
            inner.write_tx(conn, |tx| {
                inner.apply(tx, &scope, &key, |found| {
                    Ok(machine::release(found, token, now))
                })
            })
        })
        .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        // Refused before any transaction is opened.
        machine::check_lease(lease)?;
        let (scope, key) = (scope.clone(), key.clone());
        self.run(move |inner, conn| {
            inner.write_tx(conn, |tx| {
                inner.apply(tx, &scope, &key, |found| {
                    Ok(machine::extend(found, token, lease, now)?)
                })
            })
        })
        .await
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        let (scope, key) = (scope.clone(), key.clone());
        self.run(move |inner, conn| {
            Ok(row::read(conn, &inner.sql, &scope, &key)?.filter(|r| !r.is_expired(now)))
        })
        .await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |inner, conn| {
            row::read_all(
                conn,
                &inner.sql.list_in_flight,
                params![row::ts_to_sql(older_than), limit],
            )
        })
        .await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let filter = filter.clone();
        self.run(move |inner, conn| {
            let (sql, params) = inner.sql.list(&filter, now, limit);
            row::read_all(conn, &sql, rusqlite::params_from_iter(params))
        })
        .await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |inner, conn| {
            let _writer = inner.write_lock();
            conn.prepare_cached(&inner.sql.purge)
                .map_err(at("purge: prepare"))?
                .execute(params![row::ts_to_sql(now), limit])
                .map_err(at("purge"))
        })
        .await
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
