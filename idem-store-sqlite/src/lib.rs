#![doc = include_str!("../README.md")]

mod batch;
mod builder;
mod connect;
mod error;
mod maintenance;
mod migrate;
mod ops;
mod pool;
mod row;
mod schema;
mod store;
mod wake;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{self, CompleteAnswer};
use idem_core::wait::wake_when_recorded;
use idem_core::{Attempt, Outcome, StoreError};
use rusqlite::Connection;

pub use builder::SqliteStoreBuilder;
pub use connect::Synchronous;
pub use error::TableNameError;
pub use rusqlite;
pub use schema::{SCHEMA_TABLE, TableName};

use pool::Inner;

/// A [`KeyStore`](idem_core::KeyStore) in an SQLite database file: the embedded default, no server
/// needed.
///
/// - Every operation is one transaction; those that write run `BEGIN IMMEDIATE` → read the record
///   → decide with the pure rules of [`idem_core::machine`] → write → `COMMIT`, so they are atomic
///   across threads, connections and OS processes sharing the file (one host only: WAL does not
///   work on network file systems).
/// - A claim that only reads (replay, in flight, mismatch) decides from one `SELECT` and takes no
///   write lock: replays run in parallel.
/// - The blocking SQLite calls run on tokio's blocking pool (`spawn_blocking`), over a small pool
///   of connections per handle; a tokio runtime is required. Within a process, writes to one file
///   take turns (first come, first served) before they take a connection, so reads never wait
///   behind writes queued for the lock.
/// - Clones share the same connections. Each [`SqliteStore::open`] is a new handle with its own.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
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

    /// Completes `attempt`'s claim with `outcome` inside the caller's transaction `conn`, per
    /// [`idem_core::machine::complete`], under the attempt's policy and at its clock's now,
    /// without committing: the caller's effect and the completion commit together or not at all.
    /// Pass the outcome through [`Attempt::encode`] first if the executor has a codec.
    ///
    /// Once the transaction has committed, call [`Attempt::mark_recorded`], so the executor does
    /// not complete the record again; that call also wakes the requests of this process waiting
    /// on the record, as [`KeyStore::complete`](idem_core::KeyStore::complete) does after its own
    /// commit. If the transaction does not commit, don't (the executor then records the
    /// operation's own outcome as usual). If the answer is [`CompleteAnswer::Fenced`], nothing was
    /// written for the record: roll the transaction back, so the effect does not happen either.
    ///
    /// Begin the transaction with [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior)
    /// (a deferred transaction that reads then writes can fail with `SQLITE_BUSY` whatever the busy
    /// timeout). Refused with [`StoreError::Misconfigured`] outside a transaction. Blocking.
    pub fn complete_in(
        &self,
        conn: &Connection,
        attempt: &Attempt,
        outcome: &Outcome,
    ) -> Result<CompleteAnswer, StoreError> {
        let (policy, now) = (attempt.policy(), attempt.now());
        machine::check_outcome_size(outcome, policy)?;
        if conn.is_autocommit() {
            return Err(StoreError::Misconfigured {
                message: "sqlite: complete_in needs an open transaction on the connection".into(),
            });
        }
        let held = ops::Held {
            id: attempt.id(),
            token: attempt.token(),
        };
        let answer = ops::complete_on(conn, &self.inner.sql, held, outcome, policy, now)?;
        if answer != CompleteAnswer::Fenced {
            // Written, not committed: the waiters wake when the caller reports the commit.
            let (waiters, id) = (self.inner.waiters.clone(), attempt.id().clone());
            wake_when_recorded(attempt, move || waiters.wake(&id));
        }
        Ok(answer)
    }
}
