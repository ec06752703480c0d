//! Creating and upgrading the table: the embedded migrations, applied once, in one `BEGIN
//! IMMEDIATE` transaction.

use idem_core::StoreError;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::SqliteStore;
use crate::error::at;
use crate::schema::{MIGRATIONS, SCHEMA_TABLE, SCHEMA_VERSION, TableName};

impl SqliteStore {
    /// Creates or upgrades the table to this build's schema version
    /// ([`Maintenance::latest_schema_version`](idem_core::Maintenance::latest_schema_version)).
    /// Idempotent, and safe to run from several processes at once (one `BEGIN IMMEDIATE`
    /// transaction). Blocking (a local file): call it at start-up, also before a runtime
    /// exists. It waits for this process's own writes to the file as another process would (the
    /// busy timeout). [`Maintenance::migrate`](idem_core::Maintenance::migrate) is the same call.
    pub fn migrate(&self) -> Result<(), StoreError> {
        let conn = self.inner.take_connection()?;
        let result = migrate_on(&conn, &self.inner.table);
        self.inner.give_back(conn);
        result.map(|_| ())
    }
}

/// The schema version recorded for `table`, reading only: 0 when the table was never migrated
/// (no version table, or no row for this table).
pub(crate) fn version(conn: &Connection, table: &TableName) -> Result<i64, StoreError> {
    let has_versions: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [SCHEMA_TABLE],
            |row| row.get::<_, i64>(0).map(|n| n > 0),
        )
        .map_err(at("schema version: look up"))?;
    if !has_versions {
        return Ok(0);
    }
    Ok(conn
        .query_row(
            &format!("SELECT version FROM {SCHEMA_TABLE} WHERE table_name = ?1"),
            [table.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(at("schema version: read"))?
        .unwrap_or(0))
}

/// Brings `table` to [`SCHEMA_VERSION`] inside one `BEGIN IMMEDIATE` transaction, so concurrent
/// migrations (threads or processes) run each step once. Returns the version found before.
pub(crate) fn migrate_on(conn: &Connection, table: &TableName) -> Result<i64, StoreError> {
    let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(at("migrate: begin"))?;
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} \
         (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
    ))
    .map_err(at("migrate: schema table"))?;
    let found: i64 = tx
        .query_row(
            &format!("SELECT version FROM {SCHEMA_TABLE} WHERE table_name = ?1"),
            [table.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(at("migrate: read version"))?
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::Misconfigured {
            message: format!(
                "sqlite: table {table} is at schema version {found}, newer than this library's \
                 {SCHEMA_VERSION}; upgrade idem-store-sqlite"
            ),
        });
    }
    let (quoted, bare) = (table.quoted(), table.as_str());
    for step in &MIGRATIONS[usize::try_from(found).unwrap_or(0)..] {
        tx.execute_batch(&step.replace("{t}", &quoted).replace("{n}", bare))
            .map_err(at("migrate: apply"))?;
    }
    if found < SCHEMA_VERSION {
        tx.execute(
            &format!(
                "INSERT INTO {SCHEMA_TABLE} (table_name, version) VALUES (?1, ?2) \
                 ON CONFLICT (table_name) DO UPDATE SET version = excluded.version"
            ),
            rusqlite::params![bare, SCHEMA_VERSION],
        )
        .map_err(at("migrate: write version"))?;
    }
    tx.commit().map_err(at("migrate: commit"))?;
    if found < SCHEMA_VERSION {
        tracing::info!(
            table = bare,
            from = found,
            to = SCHEMA_VERSION,
            "idem sqlite schema migrated"
        );
    }
    Ok(found)
}
