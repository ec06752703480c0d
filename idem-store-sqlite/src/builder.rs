//! Opening a store: its settings ([`SqliteStoreBuilder`]), its first connection and its pool.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::StoreError;
use tokio::sync::Semaphore;

use crate::SqliteStore;
use crate::connect::{Config, Synchronous};
use crate::error::TableNameError;
use crate::pool::{Inner, file_write_lock};
use crate::schema::{self, TableName};

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
        // One write lock per database file per process (see `file_write_lock`).
        let canonical = std::fs::canonicalize(&config.path).unwrap_or_else(|_| config.path.clone());
        let inner = Inner {
            sql: schema::Statements::new(&self.table),
            table: self.table,
            config,
            max_connections: self.max_connections,
            idle: Mutex::new(vec![first]),
            permits: Arc::new(Semaphore::new(self.max_connections)),
            writer: file_write_lock(canonical.clone()),
            batch: Default::default(),
            waiters: crate::wake::file_waiters(canonical),
        };
        Ok(SqliteStore {
            inner: Arc::new(inner),
        })
    }
}
