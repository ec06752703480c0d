//! The bare engine operations idem's are measured against, and the fast prefill of live records.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Fingerprint, KeyStore, Timestamp};
use idemkit::Opened;
use idemkit::postgres::{PostgresStore, sqlx};
use idemkit::redis::{RedisStore, redis};
use idemkit::sqlite::SqliteStore;

use super::BoxError;

/// The bare engine operations on the same store (the same pool or connection manager).
#[derive(Clone)]
pub(super) enum Raw {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    Redis(redis::aio::ConnectionManager),
}

/// How long prefilled records live: past any bench run (they are deleted at its end on SQL
/// stores, and expire on Redis).
pub(super) const FILL_TTL: Duration = Duration::from_secs(3600);

impl Raw {
    /// The engine's bare connection behind `opened`, with its scratch table
    /// `idem_bench_raw` created (the only schema change `idem bench` makes).
    pub(super) async fn open(opened: &Opened) -> Result<Raw, BoxError> {
        const TABLE: &str =
            "CREATE TABLE IF NOT EXISTS idem_bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)";
        if let Some(store) = opened.engine::<SqliteStore>() {
            store.with_connection(|c| c.execute_batch(TABLE)).await??;
            return Ok(Raw::Sqlite(store.clone()));
        }
        if let Some(store) = opened.engine::<PostgresStore>() {
            sqlx::query(TABLE).execute(store.pool()).await?;
            return Ok(Raw::Postgres(store.clone()));
        }
        if let Some(store) = opened.engine::<RedisStore>()
            && !store.is_cluster()
        {
            let conn = redis::Client::open(opened.url().expose_secret())?
                .get_connection_manager()
                .await?;
            return Ok(Raw::Redis(conn));
        }
        Err(format!(
            "idem bench compares with the bare operations of SQLite, PostgreSQL and standalone Redis, not of {}",
            opened.url()
        )
        .into())
    }

    /// The engine's name, for reports and plot legends.
    pub(super) fn engine(&self) -> &'static str {
        match self {
            Raw::Sqlite(_) => "sqlite",
            Raw::Postgres(_) => "postgres",
            Raw::Redis(_) => "redis",
        }
    }

    /// The bare form of a first execution: insert the key if absent, then write its answer.
    pub(super) async fn write(&self, key: &str) -> Result<(), BoxError> {
        match self {
            Raw::Sqlite(s) => {
                let key = key.to_owned();
                s.with_connection(move |c| {
                    c.prepare_cached(
                        "INSERT INTO idem_bench_raw (k, v) VALUES (?1, 'p') ON CONFLICT DO NOTHING",
                    )?
                    .execute([&key])?;
                    c.prepare_cached("UPDATE idem_bench_raw SET v = 'c' WHERE k = ?1")?
                        .execute([&key])
                })
                .await??;
            }
            Raw::Postgres(s) => {
                sqlx::query(
                    "INSERT INTO idem_bench_raw (k, v) VALUES ($1, 'p') ON CONFLICT DO NOTHING",
                )
                .bind(key)
                .execute(s.pool())
                .await?;
                sqlx::query("UPDATE idem_bench_raw SET v = 'c' WHERE k = $1")
                    .bind(key)
                    .execute(s.pool())
                    .await?;
            }
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let _: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg("p")
                    .arg("NX")
                    .arg("PX")
                    .arg(600_000)
                    .query_async(&mut conn)
                    .await?;
                let _: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg("c")
                    .arg("XX")
                    .arg("PX")
                    .arg(600_000)
                    .query_async(&mut conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// The bare form of a replay: read the key's answer.
    pub(super) async fn read(&self, key: &str) -> Result<(), BoxError> {
        match self {
            Raw::Sqlite(s) => {
                let key = key.to_owned();
                s.with_connection(move |c| {
                    c.prepare_cached("SELECT v FROM idem_bench_raw WHERE k = ?1")?
                        .query_row([&key], |r| r.get::<_, String>(0))
                })
                .await??;
            }
            Raw::Postgres(s) => {
                let _: String = sqlx::query_scalar("SELECT v FROM idem_bench_raw WHERE k = $1")
                    .bind(key)
                    .fetch_one(s.pool())
                    .await?;
            }
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let _: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
            }
        }
        Ok(())
    }

    /// Redis only: the floor of a first execution, two trivial `EVALSHA` (idem's claim and
    /// complete are one script each). `None` on SQL stores.
    pub(super) async fn floor_first(&self, key: &str) -> Result<Option<()>, BoxError> {
        let Raw::Redis(conn) = self else {
            return Ok(None);
        };
        let mut conn = conn.clone();
        let trivial = redis::Script::new("return 1");
        for _ in 0..2 {
            let _: i64 = trivial.key(key).invoke_async(&mut conn).await?;
        }
        Ok(Some(()))
    }

    /// SQL only: a bare read of the whole idem record (`SELECT *` by primary key), to tell the
    /// statement's round trip from idem's work around it. `None` on Redis.
    pub(super) async fn read_idem_row(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<()>, BoxError> {
        match self {
            Raw::Sqlite(s) => {
                let sql = format!("SELECT * FROM {} WHERE scope = ?1 AND key = ?2", s.table());
                let (scope, key) = (scope.to_owned(), key.to_owned());
                s.with_connection(move |c| {
                    c.prepare_cached(&sql)?
                        .query_row([&scope, &key], |r| r.get::<_, String>(0))
                })
                .await??;
            }
            Raw::Postgres(s) => {
                let sql = format!(
                    "SELECT * FROM {} WHERE scope = $1 AND key = $2",
                    s.qualified_table()
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(scope)
                    .bind(key)
                    .fetch_one(s.pool())
                    .await?;
            }
            Raw::Redis(_) => return Ok(None),
        }
        Ok(Some(()))
    }

    /// SQL only: inserts completed records `from..to` in `scope` straight into the store's table
    /// in one statement (and as many rows into `idem_bench_raw`), written at `at` and expiring at
    /// `at + FILL_TTL` (an `at` over an hour ago fills expired records, for the purge bench);
    /// answers `false` on Redis, whose record format belongs to its scripts (the caller fills
    /// through the store there).
    pub(super) async fn prefill(
        &self,
        run: &str,
        scope: &str,
        fp: &Fingerprint,
        (from, to): (u64, u64),
        at: Timestamp,
    ) -> Result<bool, BoxError> {
        let now = i64::try_from(at.as_millis())?;
        let expires = now + i64::try_from(FILL_TTL.as_millis())?;
        // Columns in the schema's order; the key is `f-<i>`, the token id 32 hex digits, no
        // checkpoints.
        match self {
            Raw::Sqlite(s) => {
                let records = format!(
                    "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
                     INSERT INTO {} SELECT ?3, 'f-' || i, ?4, 'completed', 1, printf('%032x', i), 1, \
                     ?5, 200, '{{\"ok\":true}}', 'definitive', ?5, ?5, ?6, NULL FROM n",
                    s.table()
                );
                let raw = "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
                     INSERT INTO idem_bench_raw SELECT ?3 || i, 'c' FROM n";
                let (scope, fp, raw_prefix) = (
                    scope.to_owned(),
                    fp.as_str().to_owned(),
                    format!("idem-bench:{run}:{scope}:"),
                );
                let (from, to) = (i64::try_from(from)?, i64::try_from(to)?);
                s.with_connection(move |c| {
                    let tx = c.transaction()?;
                    tx.execute(&records, (from, to, &scope, &fp, now, expires))?;
                    tx.execute(raw, (from, to, &raw_prefix))?;
                    tx.commit()
                })
                .await??;
            }
            Raw::Postgres(s) => {
                let records = format!(
                    "INSERT INTO {} SELECT $3, 'f-' || i, $4, 'completed', 1, md5(i::text), 1, \
                     $5, 200, '{{\"ok\":true}}', 'definitive', $5, $5, $6, NULL \
                     FROM generate_series($1::bigint, $2::bigint - 1) AS i",
                    s.qualified_table()
                );
                let (from, to) = (i64::try_from(from)?, i64::try_from(to)?);
                let mut tx = s.pool().begin().await?;
                sqlx::query(sqlx::AssertSqlSafe(records))
                    .bind(from)
                    .bind(to)
                    .bind(scope)
                    .bind(fp.as_str())
                    .bind(now)
                    .bind(expires)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO idem_bench_raw SELECT $3 || i, 'c' \
                     FROM generate_series($1::bigint, $2::bigint - 1) AS i",
                )
                .bind(from)
                .bind(to)
                .bind(format!("idem-bench:{run}:{scope}:"))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                // Fresh statistics come from `settle`, after the whole fill.
            }
            Raw::Redis(_) => return Ok(false),
        }
        Ok(true)
    }

    /// After a bulk fill, brings the engine back to the steady state of a store that grew by
    /// ordinary traffic, so that the measurement does not pay for the fill: SQLite checkpoints
    /// the write-ahead log into the database file and truncates it (a fill of millions of rows
    /// leaves gigabytes of it, which ordinary commits would otherwise checkpoint while being
    /// timed); PostgreSQL vacuums and analyses the records table and checkpoints (the
    /// `CHECKPOINT` needs a superuser or `pg_checkpoint`; without it, it is skipped). Nothing on
    /// Redis.
    pub(super) async fn settle(&self) -> Result<(), BoxError> {
        match self {
            Raw::Sqlite(s) => {
                s.with_connection(|c| {
                    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                        r.get::<_, i64>(0)
                    })
                })
                .await??;
            }
            Raw::Postgres(s) => {
                for table in [s.qualified_table(), "idem_bench_raw"] {
                    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {table}")))
                        .execute(s.pool())
                        .await?;
                }
                let _ = sqlx::query("CHECKPOINT").execute(s.pool()).await;
            }
            Raw::Redis(_) => {}
        }
        Ok(())
    }

    /// What the store occupies, in bytes: PostgreSQL the records table with its indexes
    /// (`pg_total_relation_size`), SQLite the database file (pages in use), Redis `used_memory`.
    pub(super) async fn store_bytes(&self) -> Result<u64, BoxError> {
        Ok(match self {
            Raw::Sqlite(s) => s
                .with_connection(|c| {
                    c.query_row(
                        "SELECT page_size * (page_count - freelist_count) \
                         FROM pragma_page_size, pragma_page_count, pragma_freelist_count",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                })
                .await??
                .try_into()?,
            Raw::Postgres(s) => {
                let n: i64 = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
                    .bind(s.qualified_table())
                    .fetch_one(s.pool())
                    .await?;
                n.try_into()?
            }
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let info: String = redis::cmd("INFO")
                    .arg("memory")
                    .query_async(&mut conn)
                    .await?;
                info.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .ok_or("INFO memory has no used_memory")?
                    .trim()
                    .parse()?
            }
        })
    }

    /// Removes bench run `run`'s scratch rows and the records of its prefilled `scopes`. On SQL
    /// the measured records stay, as records of any caller would; on Redis the whole run lives
    /// under a key prefix of its own ([`Raw::bench_store`]), and all of it goes.
    pub(super) async fn clean(&self, run: &str, scopes: &[&str]) -> Result<(), BoxError> {
        let pattern = format!("idem-bench:{run}:%");
        let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
        match self {
            Raw::Sqlite(s) => {
                let records = format!("DELETE FROM {} WHERE scope = ?1", s.table());
                s.with_connection(move |c| {
                    c.execute("DELETE FROM idem_bench_raw WHERE k LIKE ?1", [&pattern])?;
                    scopes
                        .iter()
                        .try_for_each(|scope| c.execute(&records, [scope]).map(drop))
                })
                .await??;
            }
            Raw::Postgres(s) => {
                sqlx::query("DELETE FROM idem_bench_raw WHERE k LIKE $1")
                    .bind(pattern)
                    .execute(s.pool())
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM {} WHERE scope = ANY($1)",
                    s.qualified_table()
                )))
                .bind(scopes)
                .execute(s.pool())
                .await?;
            }
            Raw::Redis(conn) => {
                // SCAN visits every key once over the whole walk; UNLINK frees off the main thread.
                let mut conn = conn.clone();
                let pattern = format!("{}:*", redis_prefix(run));
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await?;
                    if !keys.is_empty() {
                        let _: i64 = redis::cmd("UNLINK")
                            .arg(&keys)
                            .query_async(&mut conn)
                            .await?;
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
        Ok(())
    }

    /// The store to measure: the one opened, except on Redis, where it is the same store under
    /// the run's own key prefix, so that [`Raw::clean`] can remove millions of prefilled records
    /// and their index entries without touching anybody else's.
    pub(super) fn bench_store(
        &self,
        opened: &Opened,
        run: &str,
    ) -> Result<Arc<dyn KeyStore>, BoxError> {
        Ok(match (self, opened.engine::<RedisStore>()) {
            (Raw::Redis(_), Some(store)) => {
                Arc::new(store.clone().with_prefix(&redis_prefix(run))?)
            }
            _ => opened.store(),
        })
    }
}

/// The key prefix of bench run `run` on Redis.
fn redis_prefix(run: &str) -> String {
    format!("idem-bench-{run}")
}
