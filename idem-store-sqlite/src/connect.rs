//! How each connection of a store is opened: WAL, [`Synchronous`], busy timeout.

use std::path::PathBuf;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::error::at;

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
