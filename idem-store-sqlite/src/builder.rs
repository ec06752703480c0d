//! Opening a store: its settings ([`SqliteStoreBuilder`], [`Synchronous`]) and how each
//! connection is opened (WAL, `synchronous`, busy timeout).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use crate::SqliteStore;
use crate::error::{TableNameError, at};
use crate::pool::{Inner, file_write_lock};
use crate::schema::{self, TableName};

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
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// Settings of a [`SqliteStore`]; start from [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    pub(crate) path: PathBuf,
    pub(crate) table: TableName,
    pub(crate) synchronous: Synchronous,
    pub(crate) busy_timeout: Duration,
    pub(crate) max_connections: usize,
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
            writer: file_write_lock(canonical.clone()),
            notifier: crate::wake::file_notifier(canonical),
        };
        Ok(SqliteStore {
            inner: Arc::new(inner),
        })
    }
}

/// How every connection of a store is opened.
pub(crate) struct Config {
    pub(crate) path: PathBuf,
    pub(crate) synchronous: Synchronous,
    pub(crate) busy_timeout: Duration,
}

impl Config {
    pub(crate) fn connect(&self) -> Result<Connection, StoreError> {
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
