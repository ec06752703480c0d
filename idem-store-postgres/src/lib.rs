#![doc = include_str!("../README.md")]

mod durability;
mod error;
mod row;
mod schema;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{
    self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, Policy, Record, RecordState, Scope,
    StoreError, Timestamp, Token, async_trait,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres, Row, SqlStr};

pub use durability::{DurabilityReport, DurabilityWarning, Replica, ServerConfig};
pub use error::{InvalidIdentifier, MAX_IDENTIFIER_BYTES};

/// The newest migration this crate knows: a table at a lower version needs
/// [`PostgresStore::migrate`] (see [`PostgresStore::schema_version`]).
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].version;
/// The driver this crate is built on, re-exported so callers use the same version.
pub use sqlx;

use error::{check_identifier, classify, is_transient_conflict, sqlstate};
use row::{big, bind_record, record_from_row, timestamp, ts};
use schema::{MIGRATIONS, Statements, trusted};

/// How many times a claim re-reads and retries when the record changes under it (another claim,
/// a completion, a purge) or the server reports a serialization conflict, before giving up with
/// [`StoreError::Unavailable`].
const MAX_CLAIM_ROUNDS: usize = 16;

/// How many times `complete`, `release` and `extend` run their statement while the server answers
/// with a serialization failure or a deadlock (SQLSTATE 40001, 40P01), before giving up with
/// [`StoreError::Unavailable`].
const MAX_CONFLICT_RETRIES: usize = 16;

/// Runs `statement` (one autocommit statement on the pool) again while the server reports a
/// serialization failure or a deadlock: the server rolled the statement back, so running it
/// again is exactly one attempt more (a server whose `default_transaction_isolation` is
/// `serializable` or `repeatable read` raises 40001 when a concurrent writer committed to the
/// row after the statement's snapshot). Codes by SQLSTATE, never by message text.
async fn retry_conflicts<T, F, Fut>(op: &'static str, mut statement: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    for round in 1..=MAX_CONFLICT_RETRIES {
        match statement().await {
            Ok(value) => return Ok(value),
            Err(e) if is_transient_conflict(&e) => {
                tracing::debug!(op, round, error = %e, "serialization conflict; running the statement again");
                conflict_backoff(round).await;
            }
            Err(e) => return Err(classify(op, e)),
        }
    }
    tracing::warn!(
        op,
        "gave up after {MAX_CONFLICT_RETRIES} serialization conflicts in a row"
    );
    Err(StoreError::Unavailable {
        message: format!(
            "postgres {op}: {MAX_CONFLICT_RETRIES} serialization conflicts in a row; try again"
        ),
        source: None,
    })
}

/// Waits a random 0..=min(2^round, 50) ms before running a conflicting statement again: under
/// SERIALIZABLE, conflicts also come from neighbouring rows (predicate locks on index pages), and
/// statements that collided collide again if they all retry at once.
async fn conflict_backoff(round: usize) {
    let cap = 1u64 << round.min(6);
    let ms = rand::random_range(0..=cap.min(50));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A [`KeyStore`] keeping records in one PostgreSQL table.
///
/// - A claim is one round trip in the common cases: one statement inserts the record if the key is
///   new (`INSERT … ON CONFLICT DO NOTHING`, writing nothing on conflict) and reads the record that
///   was there. When that statement's snapshot predates a conflicting row (it waited on a
///   concurrent inserter that then committed, [contract §7](idem_core::contract#traps)), a separate `SELECT` reads it. The rules of
///   [`idem_core::machine`] decide; a write they call for (expired record, retry, takeover) is a
///   compare-and-set `UPDATE` that re-reads and retries if the record changed meanwhile. Replays
///   only read.
/// - `complete`, `release` and `extend` are one fenced `UPDATE` each, run again when the server
///   reports a serialization failure or a deadlock (SQLSTATE 40001, 40P01), as a claim is: a
///   server whose `default_transaction_isolation` is `serializable` loses no outcome.
/// - [`PostgresStore::complete_with_conn`] completes inside the caller's transaction, so the
///   business write and the record commit together.
/// - Time always comes from the caller's `now`; the server's clock is never consulted.
///
/// Clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
}

impl fmt::Debug for PostgresStore {
    // Hand-written: the pool's options hold the connection string and password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.qualified)
            .field("pool_size", &self.pool.size())
            .field("pool_idle", &self.pool.num_idle())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// The default schema: `public`.
    pub const DEFAULT_SCHEMA: &'static str = "public";
    /// The default table: `idem_records`.
    pub const DEFAULT_TABLE: &'static str = "idem_records";

    /// A store on `pool`, in table `public.idem_records`. Call [`PostgresStore::migrate`] once
    /// before use.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(Self::DEFAULT_SCHEMA, Self::DEFAULT_TABLE)),
        }
    }

    /// A store on `pool`, in table `schema.table`. Both names must be 1 to
    /// [`MAX_IDENTIFIER_BYTES`] bytes of lower-case ASCII letters, digits and `_`, not starting
    /// with a digit; anything else is refused before any SQL is built.
    pub fn with_table(pool: PgPool, schema: &str, table: &str) -> Result<Self, InvalidIdentifier> {
        check_identifier("schema", schema)?;
        check_identifier("table", table)?;
        Ok(Self {
            pool,
            sql: Arc::new(Statements::new(schema, table)),
        })
    }

    /// Connects a pool of up to 10 connections to `url` (`postgres://user:pass@host/db`) and
    /// returns a store in table `public.idem_records`. For other settings build the pool yourself
    /// and use [`PostgresStore::new`] or [`PostgresStore::with_table`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(|e| StoreError::Misconfigured {
            message: format!("postgres connection string: {e}"),
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(|e| classify("connect", e))?;
        Ok(Self::new(pool))
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The quoted, schema-qualified table name, e.g. `"public"."idem_records"`.
    pub fn qualified_table(&self) -> &str {
        &self.sql.qualified
    }

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
        let op = "migrate";
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
        let mut conn = self.pool.acquire().await.map_err(|e| classify(op, e))?;
        let conn: &mut PgConnection = &mut conn;
        let encoding: String = sqlx::query_scalar("SELECT current_setting('server_encoding')")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| classify(op, e))?;
        if encoding != "UTF8" {
            return Err(StoreError::Misconfigured {
                message: format!(
                    "postgres database encoding is {encoding}; idem needs UTF8 to replay bodies byte for byte"
                ),
            });
        }
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|e| classify(op, e))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(advisory_key(&self.sql.qualified))
            .execute(&mut *tx)
            .await
            .map_err(|e| classify(op, e))?;
        sqlx::Executor::execute(&mut *tx, trusted(bootstrap))
            .await
            .map_err(|e| classify(op, e))?;
        let applied: Option<i32> = sqlx::query_scalar(trusted(newest_applied))
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| classify(op, e))?;
        let applied = applied.unwrap_or(0);
        let newest = MIGRATIONS.last().map_or(0, |m| m.version);
        if applied > newest {
            return Err(StoreError::Misconfigured {
                message: format!(
                    "{} is at migration {applied}, newer than this build knows ({newest})",
                    self.sql.qualified
                ),
            });
        }
        for m in MIGRATIONS.iter().filter(|m| m.version > applied) {
            let ddl = self.sql.migration_sql(m);
            sqlx::Executor::execute(&mut *tx, trusted(ddl))
                .await
                .map_err(|e| classify(op, e))?;
            sqlx::query(record_version.clone())
                .bind(m.version)
                .bind(m.description)
                .bind(ts(Timestamp::now()))
                .execute(&mut *tx)
                .await
                .map_err(|e| classify(op, e))?;
            tracing::info!(table = %self.sql.qualified, version = m.version, "idem migration applied");
        }
        tx.commit().await.map_err(|e| classify(op, e))
    }

    /// The newest migration applied to the store's table (as recorded in
    /// `schema.<table>_migrations`), reading only: 0 when it was never migrated. Below
    /// [`SCHEMA_VERSION`] the table needs [`PostgresStore::migrate`], by a role allowed to change
    /// the schema; an operator's read-only role can call this.
    pub async fn schema_version(&self) -> Result<i32, StoreError> {
        let newest_applied = schema::trusted(format!(
            "SELECT max(version) FROM {}",
            self.sql.migrations_table
        ));
        match sqlx::query_scalar::<_, Option<i32>>(newest_applied)
            .fetch_one(&self.pool)
            .await
        {
            Ok(applied) => Ok(applied.unwrap_or(0)),
            // undefined_table, invalid_schema_name: never migrated.
            Err(e) if matches!(sqlstate(&e).as_deref(), Some("42P01" | "3F000")) => Ok(0),
            Err(e) => Err(classify("schema version", e)),
        }
    }

    /// [`KeyStore::complete`] on the caller's connection, typically `&mut *tx` of an open
    /// [`sqlx::Transaction`], so the operation's own writes and the completed record commit (or
    /// roll back) together.
    ///
    /// The answer describes the transaction's view: `Completed` is only durable once the caller
    /// commits. If the transaction rolls back, the record stays `processing` with the same token,
    /// and the holder may run the operation and this method again in a new transaction.
    ///
    /// Unlike [`KeyStore::complete`], this cannot run the statement again after a serialization
    /// failure or deadlock (the caller's transaction is aborted): it answers
    /// [`StoreError::Unavailable`], and the caller retries its whole transaction.
    ///
    /// ```no_run
    /// # use idem_store_postgres::PostgresStore;
    /// # use idem_core::{CompleteAnswer, IdempotencyKey, Outcome, Policy, Scope, Timestamp, Token};
    /// # async fn demo(store: &PostgresStore, scope: &Scope, key: &IdempotencyKey, token: Token)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::default();
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO tickets (title) VALUES ($1)").bind("printer on fire")
    ///     .execute(&mut *tx).await?;
    /// let outcome = Outcome::definitive(201, &serde_json::json!({"ticket": 1}))?;
    /// match store.complete_with_conn(&mut tx, scope, key, token, &outcome, &policy, Timestamp::now()).await? {
    ///     CompleteAnswer::Fenced => tx.rollback().await?, // lost the claim: undo the effect
    ///     _ => tx.commit().await?,
    /// }
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)] // the KeyStore::complete arguments plus the connection
    pub async fn complete_with_conn(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        self.complete_on(conn, scope, key, token, outcome, policy, now)
            .await
            .map_err(|e| classify("complete", e))
    }

    #[allow(clippy::too_many_arguments)]
    async fn complete_on<'e, E>(
        &self,
        executor: E,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, sqlx::Error>
    where
        E: sqlx::Executor<'e, Database = Postgres>,
    {
        let state = machine::completed_state(outcome, policy);
        let updated = sqlx::query(self.sql.complete.clone())
            .bind(scope.as_str())
            .bind(key.as_str())
            .bind(big(token.seq))
            .bind(token.id_hex())
            .bind(ts(now))
            .bind(state.as_str())
            .bind(i32::from(outcome.status()))
            .bind(outcome.body())
            .bind(outcome.class().as_str())
            .bind(ts(now + policy.ttl()))
            .execute(executor)
            .await?
            .rows_affected();
        Ok(match (updated, state) {
            (0, _) => CompleteAnswer::Fenced,
            (_, RecordState::Completed) => CompleteAnswer::Completed,
            _ => CompleteAnswer::MarkedRetryable,
        })
    }

    async fn read(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Record>, sqlx::Error> {
        let row = sqlx::query(self.sql.select_any.clone())
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => Some(record_from_row(&row).map_err(|e| sqlx::Error::Decode(e.into()))?),
            None => None,
        })
    }

    /// One round of a claim: `Ok(Some(answer))` when decided, `Ok(None)` when the record changed
    /// under us and the round must be run again.
    async fn claim_round(
        &self,
        req: ClaimRequest<'_>,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<Option<ClaimAnswer>, sqlx::Error> {
        // Assume the key is new: a first execution costs this one statement, and so does a
        // replay (it reads the existing record in the same statement, writing nothing).
        let fresh = machine::claim(None, req, now, policy);
        let Some(record) = &fresh.write else {
            return Ok(Some(fresh.answer));
        };
        let row = bind_record(sqlx::query(self.sql.insert.clone()), record)
            .fetch_one(&self.pool)
            .await?;
        if row.try_get::<i64, _>("inserted")? == 1 {
            return Ok(Some(fresh.answer));
        }
        let found = if row.try_get::<Option<String>, _>("scope")?.is_some() {
            Some(record_from_row(&row).map_err(|e| sqlx::Error::Decode(e.into()))?)
        } else {
            // A conflict, yet no row in the statement's snapshot: the insert waited on a
            // concurrent inserter that committed after the snapshot was taken. A separate
            // statement takes a new snapshot and sees the row (idem_core::contract §7).
            self.read(req.scope, req.key).await?
        };
        let Some(found) = found else {
            return Ok(None); // purged meanwhile: insert again
        };
        let decided = machine::claim(Some(&found), req, now, policy);
        let Some(write) = decided.write else {
            return Ok(Some(decided.answer)); // replay, in flight, mismatch: nothing written
        };
        let replaced = bind_record(sqlx::query(self.sql.replace.clone()), &write)
            .bind(big(found.token.seq))
            .bind(found.token.id_hex())
            .bind(found.state.as_str())
            .bind(ts(found.lease_until))
            .bind(ts(found.expires_at))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok((replaced == 1).then_some(decided.answer))
    }

    #[allow(clippy::too_many_arguments)] // the address, the token and time, and one extra value
    async fn fenced_update(
        &self,
        op: &'static str,
        sql: &SqlStr,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
        extra: Option<i64>,
    ) -> Result<bool, StoreError> {
        let updated = retry_conflicts(op, || {
            let mut query = sqlx::query(sql.clone())
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(big(token.seq))
                .bind(token.id_hex())
                .bind(ts(now));
            if let Some(extra) = extra {
                query = query.bind(extra);
            }
            query.execute(&self.pool)
        })
        .await?
        .rows_affected();
        Ok(updated == 1)
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

/// A decode failure we raised ourselves carries a `StoreError::Corrupt`: hand it back as it is.
fn claim_error(err: sqlx::Error) -> StoreError {
    match err {
        sqlx::Error::Decode(inner) => match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => classify("claim", sqlx::Error::Decode(other)),
        },
        other => classify("claim", other),
    }
}

#[async_trait]
impl KeyStore for PostgresStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let req = ClaimRequest::new(scope, key, fingerprint);
        for round in 1..=MAX_CLAIM_ROUNDS {
            match self.claim_round(req, policy, now).await {
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => continue,
                Err(e) if is_transient_conflict(&e) => conflict_backoff(round).await,
                Err(e) => return Err(claim_error(e)),
            }
        }
        tracing::warn!(%scope, %key, "claim gave up: the record kept changing");
        Err(StoreError::Unavailable {
            message: format!(
                "postgres claim: the record changed {MAX_CLAIM_ROUNDS} times while claiming; try again"
            ),
            source: None,
        })
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
        retry_conflicts("complete", || {
            self.complete_on(&self.pool, scope, key, token, outcome, policy, now)
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
        let sql = &self.sql.release;
        Ok(
            if self
                .fenced_update("release", sql, scope, key, token, now, None)
                .await?
            {
                ReleaseAnswer::Released
            } else {
                ReleaseAnswer::Fenced
            },
        )
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        machine::check_lease(lease)?;
        // One fenced UPDATE that keeps the later deadline and returns the one stored; run again
        // on a serialization failure or deadlock, as every write is.
        let row = retry_conflicts("extend", || {
            sqlx::query(self.sql.extend.clone())
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(big(token.seq))
                .bind(token.id_hex())
                .bind(ts(now))
                .bind(ts(now + lease))
                .fetch_optional(&self.pool)
        })
        .await?;
        Ok(match row {
            Some(row) => ExtendAnswer::Extended {
                lease_until: timestamp(&row, "lease_until")?,
            },
            None => ExtendAnswer::Fenced,
        })
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(self.sql.get.clone())
            .bind(scope.as_str())
            .bind(key.as_str())
            .bind(ts(now))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify("get", e))?;
        row.as_ref().map(record_from_row).transpose()
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let rows = sqlx::query(self.sql.list_in_flight.clone())
            .bind(ts(older_than))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify("list_in_flight", e))?;
        rows.iter().map(record_from_row).collect()
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        // Only the filters that are set, so each is served by its index (state and age by
        // `(state, updated_at)` / `(updated_at)`, scope by the primary key).
        let mut sql = format!(
            "SELECT {} FROM {} WHERE expires_at > $1",
            schema::COLUMNS,
            self.sql.qualified
        );
        let mut n = 1;
        for (set, column) in [
            (filter.state.is_some(), "state = "),
            (filter.scope.is_some(), "scope = "),
            (filter.updated_before.is_some(), "updated_at <= "),
        ] {
            if set {
                n += 1;
                sql.push_str(&format!(" AND {column}${n}"));
            }
        }
        sql.push_str(&format!(
            " ORDER BY updated_at, scope, key LIMIT ${}",
            n + 1
        ));
        let mut query = sqlx::query(trusted(sql)).bind(ts(now));
        if let Some(state) = filter.state {
            query = query.bind(state.as_str());
        }
        if let Some(scope) = &filter.scope {
            query = query.bind(scope.as_str());
        }
        if let Some(before) = filter.updated_before {
            query = query.bind(ts(before));
        }
        let rows = query
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify("list", e))?;
        rows.iter().map(record_from_row).collect()
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = sqlx::query(self.sql.purge.clone())
            .bind(ts(now))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(|e| classify("purge_expired", e))?
            .rows_affected();
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}
