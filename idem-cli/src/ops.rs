//! Operator commands: inspect a key, settle a stuck one by hand, purge, check a store.

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::{
    Clock, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Policy, Record, RecordState, Scope,
    StalePolicy, SystemClock, purge_expired_all,
};
use idem_store_postgres::PostgresStore;
use idem_store_redis::RedisStore;
use idem_store_sqlite::SqliteStore;
use serde_json::{Value, json};

use crate::serve::BoxError;
use crate::store_url::StoreUrl;

/// Opens the record store named by `url` (migrating it), without the reference server's tickets.
pub async fn open_store(url: &StoreUrl) -> Result<Arc<dyn KeyStore>, BoxError> {
    Ok(match url {
        StoreUrl::Sqlite(path) => {
            if !path.exists() {
                return Err(format!("no SQLite file at {}", path.display()).into());
            }
            let store = SqliteStore::open(path)?;
            store.migrate()?;
            Arc::new(store)
        }
        StoreUrl::Postgres(url) => {
            let store = PostgresStore::connect(url).await?;
            store.migrate().await?;
            Arc::new(store)
        }
        StoreUrl::Redis(url) => {
            let store = RedisStore::connect(url).await?;
            store.migrate().await?;
            Arc::new(store)
        }
    })
}

/// A record as JSON, the outcome body parsed for reading; an encrypted body (a sealed envelope,
/// [`idem_core::codec::sealed_info`]) is shown as `"encrypted": {"algorithm", "key_id"}`, never as
/// ciphertext.
pub fn record_json(r: &Record) -> Value {
    json!({
        "scope": r.scope.as_str(),
        "key": r.key.as_str(),
        "state": r.state.as_str(),
        "fingerprint": r.fingerprint.as_str(),
        "attempt": r.attempt,
        "token": r.token.to_string(),
        "lease_until": rfc3339(r.lease_until),
        "created_at": rfc3339(r.created_at),
        "updated_at": rfc3339(r.updated_at),
        "expires_at": rfc3339(r.expires_at),
        "outcome": r.outcome.as_ref().map(|o| match idem_core::codec::sealed_info(o.body()) {
            Some(sealed) => json!({
                "status": o.status(),
                "class": o.class().as_str(),
                "encrypted": {"algorithm": sealed.algorithm, "key_id": sealed.key_id},
            }),
            None => json!({
                "status": o.status(),
                "class": o.class().as_str(),
                "body": o.body_json(),
            }),
        }),
    })
}

fn rfc3339(t: idem_core::Timestamp) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(t.as_millis()))
        .to_string()
}

/// `idem keys show SCOPE KEY`: the record, as a table or JSON.
pub async fn show(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    as_json: bool,
) -> Result<String, BoxError> {
    let record = store
        .get(scope, key, SystemClock.now())
        .await?
        .ok_or_else(|| {
            format!("no record for scope {scope:?} key {key:?} (never claimed, or expired)")
        })?;
    let v = record_json(&record);
    if as_json {
        return Ok(serde_json::to_string_pretty(&v)?);
    }
    let mut out = String::new();
    for field in [
        "scope",
        "key",
        "state",
        "attempt",
        "token",
        "fingerprint",
        "lease_until",
        "created_at",
        "updated_at",
        "expires_at",
    ] {
        let value = match &v[field] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push_str(&format!("{field:<12} {value}\n"));
    }
    match record.outcome {
        Some(o) => {
            out.push_str(&format!(
                "{:<12} {} ({})\n",
                "status",
                o.status(),
                o.class().as_str()
            ));
            match idem_core::codec::sealed_info(o.body()) {
                Some(sealed) => out.push_str(&format!(
                    "{:<12} encrypted ({}, key id {})\n",
                    "body", sealed.algorithm, sealed.key_id
                )),
                None => out.push_str(&format!(
                    "{:<12}\n{}\n",
                    "body",
                    serde_json::to_string_pretty(&o.body_json())?
                )),
            }
        }
        None => out.push_str(&format!("{:<12} none\n", "outcome")),
    }
    Ok(out)
}

/// `idem keys ls`: the records the filter selects, as a table or JSON.
pub async fn ls(
    store: &dyn KeyStore,
    filter: &idem_core::ListFilter,
    limit: usize,
    as_json: bool,
) -> Result<String, BoxError> {
    let records = store.list(filter, SystemClock.now(), limit).await?;
    if as_json {
        let all: Vec<Value> = records.iter().map(record_json).collect();
        return Ok(serde_json::to_string_pretty(&all)?);
    }
    let mut out = format!(
        "{:<17} {:>7} {:<24} {:<24} {}\n",
        "STATE", "ATTEMPT", "UPDATED", "LEASE UNTIL", "SCOPE  KEY"
    );
    for r in &records {
        out.push_str(&format!(
            "{:<17} {:>7} {:<24} {:<24} {}  {}\n",
            r.state.as_str(),
            r.attempt,
            rfc3339(r.updated_at),
            rfc3339(r.lease_until),
            r.scope,
            r.key
        ));
    }
    out.push_str(&format!("{} records\n", records.len()));
    Ok(out)
}

/// Takes a stuck record over for the operator: refuses a completed record, or one whose holder's
/// lease still runs.
async fn take_over(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<idem_core::Token, BoxError> {
    let now = SystemClock.now();
    let record = store.get(scope, key, now).await?.ok_or_else(|| {
        format!("no record for scope {scope:?} key {key:?} (never claimed, or expired)")
    })?;
    match record.state {
        RecordState::Completed => {
            return Err(format!("the record is completed (status {}); it is the answer for good and cannot be changed", record.outcome.map_or(0, |o| o.status())).into());
        }
        RecordState::Processing if !record.lease_elapsed(now) => {
            return Err(format!(
                "its holder's lease runs until {}; settle it only after the lease has elapsed",
                rfc3339(record.lease_until)
            )
            .into());
        }
        _ => {}
    }
    let takeover = Policy::builder()
        .stale(StalePolicy::Takeover)
        .ttl(
            record
                .expires_at
                .saturating_since(now)
                .max(Duration::from_secs(3600)),
        )
        .build()?;
    match store
        .claim(scope, key, &record.fingerprint, &takeover, now)
        .await?
    {
        ClaimAnswer::Claimed { token, .. } => Ok(token),
        other => Err(format!("the record changed meanwhile ({other:?}); look again").into()),
    }
}

/// `idem keys resolve SCOPE KEY --outcome FILE`: completes a stuck record with the outcome in
/// `outcome` (`{"status": 201, "body": …}`), fenced by a fresh takeover.
pub async fn resolve(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    outcome: &Value,
) -> Result<String, BoxError> {
    let status = outcome["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .ok_or("the outcome file needs a numeric \"status\"")?;
    let body = outcome
        .get("body")
        .ok_or("the outcome file needs a \"body\"")?;
    let outcome = Outcome::new(status, body, OutcomeClass::Definitive)?;
    let token = take_over(store, scope, key).await?;
    match store
        .complete(
            scope,
            key,
            token,
            &outcome,
            &Policy::default(),
            SystemClock.now(),
        )
        .await?
    {
        CompleteAnswer::Completed => Ok(format!("completed {scope} {key} with status {status}")),
        other => Err(format!(
            "not completed ({other:?}): another attempt took the record meanwhile"
        )
        .into()),
    }
}

/// `idem keys release SCOPE KEY`: gives a stuck record back for a retry, fenced by a fresh
/// takeover.
pub async fn release(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<String, BoxError> {
    let token = take_over(store, scope, key).await?;
    match store.release(scope, key, token, SystemClock.now()).await? {
        ReleaseAnswer::Released => Ok(format!(
            "released {scope} {key}: the next retry runs the operation"
        )),
        ReleaseAnswer::Fenced => {
            Err("not released: another attempt took the record meanwhile".into())
        }
    }
}

/// `idem purge`: deletes expired records in batches, with progress.
pub async fn purge(store: &dyn KeyStore, batch: usize, progress: bool) -> Result<String, BoxError> {
    let report = purge_expired_all(store, &SystemClock, batch, None, |r| {
        if progress {
            eprint!("\r  purged {} records in {} batches", r.deleted, r.batches);
        }
    })
    .await?;
    if progress {
        eprintln!();
    }
    Ok(format!(
        "purged {} expired records in {} batches",
        report.deleted, report.batches
    ))
}

/// The server settings that allow a lost claim, one line each naming the setting and the risk
/// (`idem conformance` prints them before the suite). Redis is judged as a store without
/// `with_wait_for_replicas`, which is what `--store` opens: an application that waits for its
/// replicas should call `RedisStore::check_config` on its own store. SQLite has none to check.
pub async fn durability_warnings(url: &StoreUrl) -> Result<Vec<String>, BoxError> {
    Ok(match url {
        StoreUrl::Sqlite(_) => Vec::new(),
        StoreUrl::Postgres(url) => PostgresStore::connect(url)
            .await?
            .check_config()
            .await?
            .warnings
            .iter()
            .map(|w| format!("postgres: {w}"))
            .collect(),
        StoreUrl::Redis(url) => RedisStore::connect(url)
            .await?
            .check_config()
            .await?
            .warnings
            .iter()
            .map(|w| format!("redis {w}"))
            .collect(),
    })
}

/// `idem conformance --store URL`: the public suite against a live store, case by case.
pub fn conformance(url: StoreUrl) -> idem_conformance::Report {
    let factory = move || {
        let url = url.clone();
        async move { open_store(&url).await.expect("the store opens") }
    };
    idem_conformance::run_all(factory)
}

/// The bare engine operations idem's are measured against, on the same store.
enum Raw {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    Redis(idem_store_redis::redis::aio::ConnectionManager),
}

impl Raw {
    async fn open(url: &StoreUrl) -> Result<(Arc<dyn KeyStore>, Raw), BoxError> {
        Ok(match url {
            StoreUrl::Sqlite(path) => {
                let store = SqliteStore::open(path)?;
                store.migrate()?;
                store
                    .with_connection(|c| {
                        c.execute_batch(
                            "CREATE TABLE IF NOT EXISTS idem_bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
                        )
                    })
                    .await??;
                (Arc::new(store.clone()), Raw::Sqlite(store))
            }
            StoreUrl::Postgres(url) => {
                let store = PostgresStore::connect(url).await?;
                store.migrate().await?;
                idem_store_postgres::sqlx::query(
                    "CREATE TABLE IF NOT EXISTS idem_bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
                )
                .execute(store.pool())
                .await?;
                (Arc::new(store.clone()), Raw::Postgres(store))
            }
            StoreUrl::Redis(url) => {
                let store = RedisStore::connect(url).await?;
                store.migrate().await?;
                let conn = idem_store_redis::redis::Client::open(url.as_str())?
                    .get_connection_manager()
                    .await?;
                (Arc::new(store), Raw::Redis(conn))
            }
        })
    }

    /// The bare form of a first execution: insert the key if absent, then write its answer.
    async fn write(&self, key: &str) -> Result<(), BoxError> {
        match self {
            Raw::Sqlite(s) => {
                let key = key.to_owned();
                s.with_connection(move |c| {
                    c.execute(
                        "INSERT INTO idem_bench_raw (k, v) VALUES (?1, 'p') ON CONFLICT DO NOTHING",
                        [&key],
                    )?;
                    c.execute("UPDATE idem_bench_raw SET v = 'c' WHERE k = ?1", [&key])
                })
                .await??;
            }
            Raw::Postgres(s) => {
                use idem_store_postgres::sqlx;
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
                use idem_store_redis::redis;
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

    /// Removes the raw rows of bench run `run` (Redis keys expire on their own).
    async fn clean(&self, run: &str) -> Result<(), BoxError> {
        let pattern = format!("idem-bench:{run}:%");
        match self {
            Raw::Sqlite(s) => {
                s.with_connection(move |c| {
                    c.execute("DELETE FROM idem_bench_raw WHERE k LIKE ?1", [&pattern])
                })
                .await??;
            }
            Raw::Postgres(s) => {
                idem_store_postgres::sqlx::query("DELETE FROM idem_bench_raw WHERE k LIKE $1")
                    .bind(pattern)
                    .execute(s.pool())
                    .await?;
            }
            Raw::Redis(_) => {}
        }
        Ok(())
    }

    /// The bare form of a replay: read the key's answer.
    async fn read(&self, key: &str) -> Result<(), BoxError> {
        match self {
            Raw::Sqlite(s) => {
                let key = key.to_owned();
                s.with_connection(move |c| {
                    c.query_row("SELECT v FROM idem_bench_raw WHERE k = ?1", [&key], |r| {
                        r.get::<_, String>(0)
                    })
                })
                .await??;
            }
            Raw::Postgres(s) => {
                let _: String = idem_store_postgres::sqlx::query_scalar(
                    "SELECT v FROM idem_bench_raw WHERE k = $1",
                )
                .bind(key)
                .fetch_one(s.pool())
                .await?;
            }
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let _: Option<String> = idem_store_redis::redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// What `idem bench` measured: mean latencies in microseconds, one caller.
#[derive(Debug, Clone, Copy)]
pub struct BenchReport {
    /// Operations of each kind.
    pub operations: usize,
    /// idem claim + complete of a new key.
    pub idem_first: f64,
    /// The raw insert-if-absent + update.
    pub raw_first: f64,
    /// idem claim of a completed key.
    pub idem_replay: f64,
    /// The raw read.
    pub raw_replay: f64,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} operations of each kind, one caller, idem and raw interleaved",
            self.operations
        )?;
        writeln!(
            f,
            "{:<18}{:>12}{:>12}{:>9}",
            "", "idem µs", "raw µs", "ratio"
        )?;
        for (name, idem, raw) in [
            ("first execution", self.idem_first, self.raw_first),
            ("replay", self.idem_replay, self.raw_replay),
        ] {
            writeln!(f, "{name:<18}{idem:>12.1}{raw:>12.1}{:>8.2}×", idem / raw)?;
        }
        Ok(())
    }
}

/// `idem bench --store URL`: idem's first execution and replay against the bare engine
/// operations on the same store, as ratios.
pub async fn bench(url: &StoreUrl, operations: usize) -> Result<BenchReport, BoxError> {
    use std::time::Instant;
    let (store, raw) = Raw::open(url).await?;
    let run = format!("{:016x}", rand::random::<u64>());
    let scope = Scope::new(format!("idem-bench/{run}"))?;
    let fp = idem_core::Fingerprint::of("bench", &json!({}))?;
    let policy = Policy::default();
    let outcome = Outcome::definitive(200, &json!({"ok": true}))?;
    let (mut idem_first, mut raw_first, mut idem_replay, mut raw_replay) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    let keys: Vec<IdempotencyKey> = (0..operations)
        .map(|i| IdempotencyKey::new(format!("k-{i}")))
        .collect::<Result<_, _>>()?;
    for key in &keys {
        let raw_key = format!("idem-bench:{run}:{key}");
        let t = Instant::now();
        let ClaimAnswer::Claimed { token, .. } = store
            .claim(&scope, key, &fp, &policy, SystemClock.now())
            .await?
        else {
            return Err("a fresh bench key was not claimed".into());
        };
        store
            .complete(&scope, key, token, &outcome, &policy, SystemClock.now())
            .await?;
        idem_first += t.elapsed();
        let t = Instant::now();
        raw.write(&raw_key).await?;
        raw_first += t.elapsed();
    }
    for key in &keys {
        let raw_key = format!("idem-bench:{run}:{key}");
        let t = Instant::now();
        let answer = store
            .claim(&scope, key, &fp, &policy, SystemClock.now())
            .await?;
        idem_replay += t.elapsed();
        if !matches!(answer, ClaimAnswer::Replay(_)) {
            return Err(format!("expected a replay, got {answer:?}").into());
        }
        let t = Instant::now();
        raw.read(&raw_key).await?;
        raw_replay += t.elapsed();
    }
    raw.clean(&run).await?;
    let mean = |d: Duration| d.as_secs_f64() * 1e6 / operations.max(1) as f64;
    Ok(BenchReport {
        operations,
        idem_first: mean(idem_first),
        raw_first: mean(raw_first),
        idem_replay: mean(idem_replay),
        raw_replay: mean(raw_replay),
    })
}
