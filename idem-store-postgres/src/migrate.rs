//! Creating and upgrading the table: the embedded migrations, applied once, under an advisory
//! lock.

use idem_core::{StoreError, Timestamp};
use sqlx::{PgConnection, Row, SqlStr};

use crate::PostgresStore;
use crate::conflict::retry_conflicts;
use crate::row::ts;
use crate::schema::{MIGRATIONS, trusted};

impl PostgresStore {
    /// Creates the schema, the table and its indexes, applying every embedded migration not yet
    /// applied (tracked in `schema.<table>_migrations`).
    ///
    /// Safe to call from any number of processes at once: the migrations run in one transaction
    /// under a transaction-scoped advisory lock named after the table. Also checks that the
    /// database encoding is UTF8, without which stored bodies would not replay byte for byte.
    ///
    /// Needs a role that may create in the database and schema (PostgreSQL checks that even when
    /// everything exists); the store's day-to-day role only needs `SELECT`, `INSERT`, `UPDATE`
    /// and `DELETE` on the table.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.ready().await;
        // Run again as a whole (a new transaction) after a serialization failure or a collision.
        retry_conflicts(&self.mode, "migrate", || self.migrate_once()).await?
    }

    /// One attempt of [`PostgresStore::migrate`]: the driver's error outside, a refusal inside.
    async fn migrate_once(&self) -> Result<Result<(), StoreError>, sqlx::Error> {
        let bootstrap = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {versions} (version INTEGER PRIMARY KEY, \
             description TEXT NOT NULL, applied_at_ms BIGINT NOT NULL);",
            schema = self.sql.schema_ident,
            versions = self.sql.migrations_table,
        );
        let newest_applied = format!("SELECT max(version) FROM {}", self.sql.migrations_table);
        let record_version = trusted(format!(
            "INSERT INTO {} (version, description, applied_at_ms) VALUES ($1, $2, $3)",
            self.sql.migrations_table
        ));
        let mut conn = self.pool.acquire().await?;
        let conn: &mut PgConnection = &mut conn;
        let encoding: String = self
            .statement(&SqlStr::from_static(
                "SELECT current_setting('server_encoding')",
            ))
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
        if encoding != "UTF8" {
            return Ok(Err(StoreError::Misconfigured {
                message: format!(
                    "postgres database encoding is {encoding}; idem needs UTF8 to replay bodies byte for byte"
                ),
            }));
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        self.statement(&SqlStr::from_static("SELECT pg_advisory_xact_lock($1)"))
            .bind(advisory_key(&self.sql.qualified))
            .execute(&mut *tx)
            .await?;
        sqlx::Executor::execute(&mut *tx, trusted(bootstrap)).await?;
        let applied: Option<i32> = self
            .statement(&trusted(newest_applied))
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let applied = applied.unwrap_or(0);
        let newest = MIGRATIONS.last().map_or(0, |m| m.version);
        if applied > newest {
            return Ok(Err(StoreError::Misconfigured {
                message: format!(
                    "{} is at migration {applied}, newer than this build knows ({newest})",
                    self.sql.qualified
                ),
            }));
        }
        for m in MIGRATIONS.iter().filter(|m| m.version > applied) {
            let ddl = self.sql.migration_sql(m);
            sqlx::Executor::execute(&mut *tx, trusted(ddl)).await?;
            self.statement(&record_version)
                .bind(m.version)
                .bind(m.description)
                .bind(ts(Timestamp::now()))
                .execute(&mut *tx)
                .await?;
            tracing::info!(table = %self.sql.qualified, version = m.version, "idem migration applied");
        }
        tx.commit().await?;
        Ok(Ok(()))
    }
}

/// A stable 64-bit advisory-lock key for a table (FNV-1a of its qualified name).
fn advisory_key(qualified: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"idem-store-postgres:".iter().chain(qualified.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}
