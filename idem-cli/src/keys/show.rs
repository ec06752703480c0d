//! `idem keys ls` and `idem keys show`: records as a table or JSON, read only.

use std::time::Duration;

use idem_core::metrics::timed;
use idem_core::{Clock, IdempotencyKey, KeyStore, Record, RecordId, Scope, SystemClock, Timestamp};
use serde_json::{Value, json};

use crate::exit::Failure;

/// A record as JSON, the outcome body parsed for reading; an encrypted body (a sealed envelope,
/// [`idem_core::codec::sealed_info`]) is shown as `"encrypted": {"algorithm", "key_id"}`, never as
/// ciphertext.
pub fn record_json(r: &Record) -> Value {
    let mut v = record_fields(r);
    v["checkpoints"] = super::steps::checkpoints_json(r, rfc3339);
    v
}

fn record_fields(r: &Record) -> Value {
    json!({
        "scope": r.scope.as_str(),
        "key": r.key.as_str(),
        "key_source": r.key_origin().as_str(),
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

pub(super) fn rfc3339(t: idem_core::Timestamp) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(t.as_millis()))
        .to_string()
}

/// The record of (`scope`, `key`), or [`Exit::NotFound`](crate::exit::Exit::NotFound).
pub(super) async fn record(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    now: Timestamp,
) -> Result<Record, Failure> {
    timed(
        store.backend(),
        "get",
        store.get(&RecordId::new(scope.clone(), key.clone()), now),
    )
    .await?
    .ok_or_else(|| {
        Failure::not_found(format!(
            "no record for scope {scope:?} key {key:?} (never claimed, or expired)"
        ))
    })
}

/// `idem keys show SCOPE KEY`: the record, as a table or JSON.
pub async fn show(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    as_json: bool,
) -> Result<String, Failure> {
    let record = record(store, scope, key, SystemClock.now()).await?;
    let v = record_json(&record);
    if as_json {
        return Ok(pretty(&v));
    }
    let mut out = String::new();
    for field in [
        "scope",
        "key",
        "key_source",
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
    let steps = super::steps::checkpoints_text(&record, rfc3339);
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
                None => out.push_str(&format!("{:<12}\n{}\n", "body", pretty(&o.body_json()))),
            }
        }
        None => out.push_str(&format!("{:<12} none\n", "outcome")),
    }
    out.push_str(&steps);
    Ok(out)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// `idem keys ls`: the records the filter selects, as a table or JSON.
pub async fn ls(
    store: &dyn KeyStore,
    filter: &idem_core::store::ListFilter,
    limit: usize,
    as_json: bool,
) -> Result<String, Failure> {
    let records = timed(
        store.backend(),
        "list",
        store.list(filter, SystemClock.now(), limit),
    )
    .await?;
    if as_json {
        let all: Vec<Value> = records.iter().map(record_json).collect();
        return Ok(pretty(&Value::Array(all)));
    }
    let mut out = format!(
        "{:<17} {:>7} {:<24} {:<24} {:<14} {}\n",
        "STATE", "ATTEMPT", "UPDATED", "LEASE UNTIL", "KEY SOURCE", "SCOPE  KEY"
    );
    for r in &records {
        out.push_str(&format!(
            "{:<17} {:>7} {:<24} {:<24} {:<14} {}  {}\n",
            r.state.as_str(),
            r.attempt,
            rfc3339(r.updated_at),
            rfc3339(r.lease_until),
            r.key_origin().as_str(),
            r.scope,
            r.key
        ));
    }
    out.push_str(&format!("{} records\n", records.len()));
    Ok(out)
}
