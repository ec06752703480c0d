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

/// A record as JSON, the outcome body parsed for reading.
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
        "outcome": r.outcome.as_ref().map(|o| json!({
            "status": o.status(),
            "class": o.class().as_str(),
            "body": o.body_json(),
        })),
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
            out.push_str(&format!(
                "{:<12}\n{}\n",
                "body",
                serde_json::to_string_pretty(&o.body_json())?
            ));
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

/// `idem conformance --store URL`: the public suite against a live store, case by case.
pub fn conformance(url: StoreUrl) -> idem_conformance::Report {
    let factory = move || {
        let url = url.clone();
        async move { open_store(&url).await.expect("the store opens") }
    };
    idem_conformance::run_all(factory)
}
