//! Operator commands: inspect a key, settle a stuck one by hand, purge, check a store.
//!
//! Every store is opened through [`idemkit::open()`]; only `idem migrate` (and the reference
//! server) change the schema.

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::metrics::timed;
use idem_core::reconcile::{PurgePace, purge_expired_paced};
use idem_core::{
    Clock, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Policy, Record, RecordId, RecordState,
    Scope, StalePolicy, SystemClock, Timestamp,
};
use idemkit::{OpenOptions, Opened, StoreUrl};
use serde_json::{Value, json};

use crate::exit::Failure;

/// Opens the record store named by `url`, reading only: a missing or older schema is refused
/// with a message naming `idem migrate`, and nothing is created.
pub async fn open_store(url: &StoreUrl) -> Result<Arc<dyn KeyStore>, Failure> {
    Ok(open(url).await?.into_store())
}

/// [`open_store`], keeping the engine's own store.
pub async fn open(url: &StoreUrl) -> Result<Opened, Failure> {
    Ok(OpenOptions::new().open(url).await?)
}

/// `idem migrate`: creates or upgrades the schema (on Redis: loads the scripts and checks the
/// settings), then reports the durability warnings.
pub async fn migrate(url: &StoreUrl) -> Result<Vec<String>, Failure> {
    let opened = OpenOptions::new().migrate(true).open(url).await?;
    durability_warnings(&opened).await
}

/// A record as JSON, the outcome body parsed for reading; an encrypted body (a sealed envelope,
/// [`idem_core::codec::sealed_info`]) is shown as `"encrypted": {"algorithm", "key_id"}`, never as
/// ciphertext.
pub fn record_json(r: &Record) -> Value {
    let mut v = record_fields(r);
    v["checkpoints"] = crate::steps::checkpoints_json(r, rfc3339);
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

fn rfc3339(t: idem_core::Timestamp) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(t.as_millis()))
        .to_string()
}

/// The record of (`scope`, `key`), or [`Exit::NotFound`](crate::exit::Exit::NotFound).
async fn record(
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
    let steps = crate::steps::checkpoints_text(&record, rfc3339);
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

/// Takes a stuck record over for the operator, with a fresh token (so its holder, should it
/// still be alive, is fenced: its `complete`, `release` and `extend` are refused). Refuses a
/// completed record; refuses one whose holder's lease still runs unless `force`.
///
/// `--force` is expressed through the [`KeyStore`] trait as it is: the takeover claim is made
/// at the instant the holder's lease ends (`max(now, lease_until)`), which is exactly when the
/// contract lets a takeover happen; the store then issues a new token as for any takeover. The
/// record's `updated_at` (and its lease and expiry) are therefore reckoned from the end of the
/// overridden lease. Returns the token and the instant the operator's writes use.
async fn take_over(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    force: bool,
) -> Result<(idem_core::Token, Timestamp), Failure> {
    let now = SystemClock.now();
    let record = record(store, scope, key, now).await?;
    let mut at = now;
    match record.state {
        RecordState::Completed => {
            return Err(Failure::refused(format!(
                "the record is completed (status {}); it is the answer for good and cannot be changed",
                record.outcome.map_or(0, |o| o.status())
            )));
        }
        RecordState::Processing if !record.lease_elapsed(now) => {
            if !force {
                return Err(Failure::refused(format!(
                    "its holder's lease runs until {}; settle it after the lease has elapsed, or pass --force if you know the holder is dead (it is fenced either way)",
                    rfc3339(record.lease_until)
                )));
            }
            // The first instant at which the lease has elapsed (`lease_until <= now`).
            at = record.lease_until;
        }
        _ => {}
    }
    let takeover = Policy::builder()
        .stale(StalePolicy::Takeover)
        .ttl(
            record
                .expires_at
                .saturating_since(at)
                .max(Duration::from_secs(3600)),
        )
        .build()
        .map_err(Failure::other)?;
    match timed(
        store.backend(),
        "claim",
        store.claim(
            &RecordId::new(scope.clone(), key.clone()),
            &record.fingerprint,
            &takeover,
            at,
        ),
    )
    .await?
    {
        ClaimAnswer::Claimed { token, .. } => Ok((token, at)),
        other => Err(Failure::refused(format!(
            "the record changed meanwhile ({other:?}); look again"
        ))),
    }
}

/// The flags of the manual commands, `idem keys resolve` and `idem keys release`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManualFlags {
    /// `--force`: take the record over even while its lease is alive.
    pub force: bool,
    /// `--json`: answer with one JSON object instead of a sentence.
    pub json: bool,
}

/// `idem keys resolve SCOPE KEY --outcome FILE`: completes a stuck record with the outcome in
/// `outcome` (`{"status": 201, "body": …}`), fenced by a fresh takeover.
pub async fn resolve(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    outcome: &Value,
    flags: ManualFlags,
) -> Result<String, Failure> {
    let ManualFlags {
        force,
        json: as_json,
    } = flags;
    let status = outcome["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| Failure::usage("the outcome file needs a numeric \"status\""))?;
    let body = outcome
        .get("body")
        .ok_or_else(|| Failure::usage("the outcome file needs a \"body\""))?;
    let outcome = Outcome::new(status, body, OutcomeClass::Definitive).map_err(Failure::usage)?;
    let (token, at) = take_over(store, scope, key, force).await?;
    match timed(
        store.backend(),
        "complete",
        store.complete(
            &RecordId::new(scope.clone(), key.clone()),
            token,
            &outcome,
            &Policy::default(),
            at,
        ),
    )
    .await?
    {
        CompleteAnswer::Completed => Ok(if as_json {
            json!({"scope": scope.as_str(), "key": key.as_str(), "result": "completed", "status": status}).to_string()
        } else {
            format!("completed {scope} {key} with status {status}")
        }),
        other => Err(Failure::refused(format!(
            "not completed ({other:?}): another attempt took the record meanwhile"
        ))),
    }
}

/// `idem keys release SCOPE KEY`: gives a stuck record back for a retry, fenced by a fresh
/// takeover.
pub async fn release(
    store: &dyn KeyStore,
    scope: &Scope,
    key: &IdempotencyKey,
    flags: ManualFlags,
) -> Result<String, Failure> {
    let ManualFlags {
        force,
        json: as_json,
    } = flags;
    let (token, at) = take_over(store, scope, key, force).await?;
    match timed(
        store.backend(),
        "release",
        store.release(&RecordId::new(scope.clone(), key.clone()), token, at),
    )
    .await?
    {
        ReleaseAnswer::Released => Ok(if as_json {
            json!({"scope": scope.as_str(), "key": key.as_str(), "result": "released"}).to_string()
        } else {
            format!("released {scope} {key}: the next retry runs the operation")
        }),
        ReleaseAnswer::Fenced => Err(Failure::refused(
            "not released: another attempt took the record meanwhile",
        )),
    }
}

/// What `idem purge` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted.
    pub deleted: u64,
    /// Batches run.
    pub batches: u64,
}

/// `idem purge`: deletes expired records at `pace` (batch size and duty cycle), showing a
/// progress spinner on stderr only when stderr is a terminal (`progress`).
pub async fn purge(
    store: &dyn KeyStore,
    pace: PurgePace,
    progress: bool,
) -> Result<PurgeReport, Failure> {
    use std::io::IsTerminal;
    let bar = if progress && std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let report = purge_expired_paced(store, &SystemClock, pace, tokio::time::sleep, |r| {
        bar.set_message(format!(
            "purged {} records in {} batches",
            r.deleted, r.batches
        ));
    })
    .await;
    bar.finish_and_clear();
    let report = report?;
    Ok(PurgeReport {
        deleted: report.deleted as u64,
        batches: report.batches as u64,
    })
}

/// The settings that allow a lost claim, one line each naming the setting, the risk and what to
/// do, prefixed by the backend (`idem conformance` and `idem migrate` print them). Redis is
/// judged as a store without `with_wait_for_replicas`, which is what a URL opens: an
/// application that waits for its replicas should check its own store's
/// [`Maintenance::check_config`](idem_core::Maintenance::check_config).
pub async fn durability_warnings(opened: &Opened) -> Result<Vec<String>, Failure> {
    let backend = opened.url().backend();
    let warnings = opened
        .maintenance()
        .check_config()
        .await
        .map_err(|e| Failure::from(e).context("cannot read the server's settings"))?;
    Ok(warnings.iter().map(|w| format!("{backend}: {w}")).collect())
}

/// `idem conformance --store URL`: the public suite against a live store, case by case;
/// `on_case` sees each case as it finishes. Each case opens the store again (reading only).
pub fn conformance(
    url: StoreUrl,
    on_case: impl FnMut(&idem_conformance::CaseResult),
) -> idem_conformance::Report {
    let factory = move || {
        let url = url.clone();
        async move { open_store(&url).await.expect("the store opens") }
    };
    idem_conformance::run_streaming(factory, |_| true, on_case)
}
