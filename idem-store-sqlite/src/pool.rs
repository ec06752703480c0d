//! The connections of a handle and the write lock of a database file: every operation runs on a
//! pooled connection on tokio's blocking pool, and every write in one `IMMEDIATE` transaction
//! after its turn at the file's write lock.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use idem_core::machine::Transition;
use idem_core::{Record, RecordId, StoreError};
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, Semaphore};

use crate::connect::Config;
use crate::error::at;
use crate::schema::{self, TableName};
use crate::{SqliteStore, ops};

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) table: TableName,
    pub(crate) sql: schema::Statements,
    pub(crate) max_connections: usize,
    pub(crate) idle: Mutex<Vec<Connection>>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) writer: WriteLock,
    /// Writes waiting to share a transaction (`batch`).
    pub(crate) batch: Queue,
    /// Wakes this process's waiters on a record after each write (`wake`).
    pub(crate) waiters: idem_core::wait::Waiters,
}

/// A queued write: runs on the batch's connection inside its transaction (or, given the error
/// that kept the transaction from beginning, answers with it), and returns how to answer its
/// caller once the transaction has committed or failed. It sets the `&mut Option` when the
/// transaction must not commit (a lone write failed, or a savepoint could not be closed): the
/// batch then rolls back.
pub(crate) type Job = Box<
    dyn FnOnce(&Inner, Result<(&Connection, bool), &StoreError>, &mut Option<StoreError>) -> Answer
        + Send,
>;

/// Answers one caller with the batch's commit result.
pub(crate) type Answer = Box<dyn FnOnce(&Result<(), StoreError>) + Send>;

/// The writes of one handle waiting for a batch (`batch` takes them in turn).
#[derive(Default)]
pub(crate) struct Queue(pub(crate) Mutex<VecDeque<Job>>);

/// The process-wide write lock of a database file: one turn at a time among this process's
/// writes to the file, so SQLite's busy handler (which polls with sleeps and gives up after the
/// busy timeout) only arbitrates between processes (and [`SqliteStore::migrate`], which takes
/// the file's lock as another process would).
pub(crate) type WriteLock = Arc<AsyncMutex<()>>;

/// A write's turn at the file's [`WriteLock`]; the write runs while it is held.
pub(crate) type WriteTurn = OwnedMutexGuard<()>;

/// The [`WriteLock`] of the database file at `path` (canonical), shared by every handle of this
/// process opened on it.
///
/// It is tokio's mutex, awaited *before* a write takes a connection: a write waiting for its turn
/// holds none of the pool's connections, so the reads of the same handle (a woken retry's above
/// all) never queue behind writers that wait for the lock. Waiters take their turns in order
/// (first come, first served), so a purge between batches cannot take the lock straight back.
pub(crate) fn file_write_lock(path: PathBuf) -> WriteLock {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Weak<AsyncMutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(lock) = locks.get(&path).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, weak| weak.strong_count() > 0);
    let lock = Arc::new(AsyncMutex::new(()));
    locks.insert(path, Arc::downgrade(&lock));
    lock
}

impl Inner {
    /// The write turn if it is free now and nobody waits for it: for a blocking call that found
    /// out late that it writes (a claim). `None`: give the connection back and wait for the turn
    /// with [`SqliteStore::run_write`].
    pub(crate) fn try_write_turn(&self) -> Option<WriteTurn> {
        self.writer.clone().try_lock_owned().ok()
    }

    pub(crate) fn take_connection(&self) -> Result<Connection, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => self.config.connect(),
        }
    }

    pub(crate) fn give_back(&self, conn: Connection) {
        // A connection left inside a transaction (it cannot be after our own calls, which commit
        // or roll back) would poison the next user: drop it instead.
        if conn.is_autocommit() {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
    }

    /// Runs `f` in an `IMMEDIATE` transaction and commits; `_turn` proves the write's turn at
    /// the file's write lock.
    pub(crate) fn write_tx<A>(
        &self,
        conn: &Connection,
        _turn: &WriteTurn,
        f: impl FnOnce(&Connection) -> Result<A, StoreError>,
    ) -> Result<A, StoreError> {
        let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
            .map_err(at("begin immediate"))?;
        let answer = f(&tx)?;
        tx.commit().map_err(at("commit"))?;
        Ok(answer)
    }

    /// Reads the record, applies `rule`, writes its result: the body of every write operation.
    pub(crate) fn apply<A>(
        &self,
        conn: &Connection,
        id: &RecordId,
        rule: impl FnOnce(Option<&Record>) -> Result<Transition<A>, StoreError>,
    ) -> Result<A, StoreError> {
        let found = ops::read(conn, &self.sql, id)?;
        let transition = rule(found.as_ref())?;
        if let Some(record) = &transition.write {
            ops::write(conn, &self.sql, record, found.as_ref())?;
        }
        Ok(transition.answer)
    }
}

impl SqliteStore {
    /// Runs `f` on a pooled connection on tokio's blocking pool. At most `max_connections` at
    /// once per handle; the connection goes back to the pool unless the store was unavailable.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
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

    /// Runs the write `f` on a pooled connection after its turn at the file's write lock, which
    /// it waits for before taking a connection (see [`file_write_lock`]) and holds until `f`
    /// returns, even if the caller's future is dropped meanwhile.
    pub(crate) async fn run_write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Inner, &mut Connection, &WriteTurn) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let turn = self.inner.writer.clone().lock_owned().await;
        self.run(move |inner, conn| f(inner, conn, &turn)).await
    }
}
