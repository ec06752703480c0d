//! `idem keys resolve` and `idem keys release`: a stuck record settled by hand, its holder
//! fenced by a fresh takeover.

use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::metrics::timed;
use idem_core::{
    Clock, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Policy, RecordId, RecordState, Scope,
    StalePolicy, SystemClock, Timestamp,
};
use serde_json::{Value, json};

use super::show::{record, rfc3339};
use crate::exit::Failure;

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
