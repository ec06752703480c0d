//! [`Maintenance`] for [`SqliteStore`]: the versioned table in [`SCHEMA_TABLE`], and the one
//! setting that can lose a claim (`synchronous`).

use idem_core::{ConfigWarning, Maintenance, StoreError, async_trait};

use crate::SqliteStore;
use crate::connect::Synchronous;
use crate::migrate::version;
use crate::schema::{SCHEMA_TABLE, SCHEMA_VERSION};

/// `migrate` and `schema_version` are brief blocking calls on a local file (one transaction,
/// one read): they run on the calling thread, as opening the file does, not on the blocking
/// pool. Call them at start-up or from an operator's command, not on a busy runtime's hot path.
#[async_trait]
impl Maintenance for SqliteStore {
    /// [`SqliteStore::migrate`], on the calling thread.
    async fn migrate(&self) -> Result<(), StoreError> {
        SqliteStore::migrate(self)
    }

    /// The schema version of the store's table as recorded in [`SCHEMA_TABLE`], without creating
    /// anything (0 when it was never migrated), read on the calling thread.
    async fn schema_version(&self) -> Result<u32, StoreError> {
        let conn = self.inner.take_connection()?;
        let result = version(&conn, &self.inner.table);
        self.inner.give_back(conn);
        let found = result?;
        u32::try_from(found).map_err(|_| {
            StoreError::corrupt(format!(
                "sqlite: {SCHEMA_TABLE} records version {found} for table {}, which is not a version",
                self.inner.table
            ))
        })
    }

    fn latest_schema_version(&self) -> u32 {
        // A handful of migrations: the count always fits.
        u32::try_from(SCHEMA_VERSION).unwrap_or(u32::MAX)
    }

    /// Warns about [`Synchronous::Normal`]. The rest is not a setting the store can read: WAL
    /// needs the file on a local disk (not a network file system).
    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        let mut warnings = Vec::new();
        if self.inner.config.synchronous == Synchronous::Normal {
            warnings.push(ConfigWarning::new(
                format!("synchronous is NORMAL on {}", self.path().display()),
                "the last commits before a power loss or an OS crash can be lost, and a lost \
                 claim whose effect happened lets the retry run the operation a second time",
                "use Synchronous::Full (the default)",
            ));
        }
        Ok(warnings)
    }
}
