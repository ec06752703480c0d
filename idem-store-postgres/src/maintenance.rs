//! [`Maintenance`] for [`PostgresStore`]: the embedded migrations, the version recorded in
//! `schema.<table>_migrations`, and the durability settings of the server.

use idem_core::{ConfigWarning, Maintenance, StoreError, async_trait};

use sqlx::Row;

use crate::conflict::retry_conflicts;
use crate::error::sqlstate;
use crate::schema::trusted;
use crate::{PostgresStore, SCHEMA_VERSION};

#[async_trait]
impl Maintenance for PostgresStore {
    /// [`PostgresStore::migrate`]: every embedded migration not yet applied, in one transaction
    /// under an advisory lock.
    async fn migrate(&self) -> Result<(), StoreError> {
        PostgresStore::migrate(self).await
    }

    /// The newest migration applied to the store's table (as recorded in
    /// `schema.<table>_migrations`), reading only: 0 when it was never migrated. An operator's
    /// read-only role can call it.
    async fn schema_version(&self) -> Result<u32, StoreError> {
        self.ready().await;
        let newest_applied = trusted(format!(
            "SELECT max(version) FROM {}",
            self.sql.migrations_table
        ));
        let applied = retry_conflicts(&self.mode, "schema version", || async {
            let read = self.statement(&newest_applied).fetch_one(&self.pool).await;
            match read.and_then(|row| row.try_get::<Option<i32>, _>(0)) {
                Ok(applied) => Ok(applied.unwrap_or(0)),
                // undefined_table, invalid_schema_name: never migrated.
                Err(e) if matches!(sqlstate(&e).as_deref(), Some("42P01" | "3F000")) => Ok(0),
                Err(e) => Err(e),
            }
        })
        .await?;
        u32::try_from(applied).map_err(|_| {
            StoreError::corrupt(format!(
                "{} records migration {applied}, which is not a version",
                self.sql.migrations_table
            ))
        })
    }

    fn latest_schema_version(&self) -> u32 {
        SCHEMA_VERSION
    }

    /// Reads `synchronous_commit`, `synchronous_standby_names`, `fsync`, `pg_is_in_recovery()`
    /// and the rows of `pg_stat_replication` as the store's connections see them (a setting
    /// made per role, per database or in the connection string counts), and warns about
    /// `synchronous_commit = off`, `local` with synchronous standbys named, standbys that stream
    /// asynchronously, a synchronous standby named but absent, `fsync = off`, and a server in
    /// recovery.
    ///
    /// A role without `pg_monitor` sees the rows of `pg_stat_replication` but not their
    /// `sync_state`: grant it to the role that runs the check.
    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        self.ready().await;
        self.durability_warnings().await
    }
}
