//! Settling one stale record: read it back, take it over under its own expiry, ask the probe,
//! and complete, release or leave it.

use std::time::Duration;

use crate::codec::{CodecContext, OutcomeCodec};
use crate::executor::{CompletionError, Held, complete_or_not_kept};
use crate::machine::{ClaimAnswer, ClaimKind, CompleteAnswer, ReleaseAnswer};
use crate::metrics::{count_reconcile, timed};
use crate::{Clock, KeyStore, Policy, Record, StalePolicy, StoreError, Timestamp, Token};

use super::probe::{Finding, Probe, ReconcileReport};

/// What settling a record needs: the reconciler's parts, borrowed for one pass.
pub(super) struct Settler<'a, P> {
    pub(super) store: &'a dyn KeyStore,
    pub(super) clock: &'a dyn Clock,
    pub(super) policy: &'a Policy,
    pub(super) probe: &'a P,
    pub(super) codec: Option<&'a dyn OutcomeCodec>,
}

/// The policy of the [`Reconciler`](super::Reconciler)'s takeover claim of `read`, the stale
/// record it read back at `read_at`, made at `now`: `policy` under [`StalePolicy::Takeover`],
/// with the record's **own expiry** (ttl `read.expires_at − now`) and a lease that ends before
/// it (at most that ttl − 1 ms). `None`, and no claim, when less than 2 ms are left (too little
/// for a valid policy: the record is left to expiry) or when the read is a lease old or older.
///
/// Why its own expiry: the claim is a store call of its own, after the read, and whatever
/// record it finds is what it writes to. If the listed record expired (and was purged) in
/// between, the claim creates a record (`New`, `ExpiredReplaced`) with the dead operation's
/// fingerprint; with the policy's full ttl that record, given back, would stay
/// `failed_retryable` for a whole ttl and refuse another request on the key as a mismatch
/// (contract §2: an expired record is as if it did not exist). Under the record's own expiry,
/// a record the claim creates expires when the listed one did: with one clock the claim is not
/// even made once that instant has passed (`now` is taken afresh for the claim); with clocks
/// that disagree (a purge on a host whose clock is ahead), the created record lives no longer
/// than the listed one would have. This needs nothing of a store but the claim rule
/// (`expires_at = now + ttl`, an expired record absent), which the conformance suite checks.
///
/// Why a read at most a lease old: a claim takes over only a record whose lease elapsed at
/// `now`; a later attempt (claimed after the read) has a lease running past `read_at + lease`,
/// so within a lease of the read the record taken over is the very attempt that was read, and
/// its own expiry is the one to keep. A reconciler paused longer skips the record and reads it
/// again on the next pass.
///
/// The price: reconciliation never prolongs a record. One taken over keeps the expiry it had
/// (a completion still gets the full ttl), so a record the probe cannot tell about expires at
/// its ttl like any other; and one that became `failed_retryable` just before the claim is
/// given back with the expiry of the record that was read.
///
/// Public so that a model of the protocol runs the same rule (`idem-model-check`).
pub fn takeover_policy(
    policy: &Policy,
    read: &Record,
    read_at: Timestamp,
    now: Timestamp,
) -> Option<Policy> {
    if now.saturating_since(read_at) >= policy.lease() {
        return None;
    }
    let ttl = read.expires_at.saturating_since(now);
    let lease = policy
        .lease()
        .min(ttl.saturating_sub(Duration::from_millis(1)));
    policy
        .to_builder()
        .stale(StalePolicy::Takeover)
        .ttl(ttl)
        .lease(lease)
        .build()
        .ok()
}

impl<P: Probe> Settler<'_, P> {
    /// Counts `record` as skipped (no longer the stale claim that was listed), with `why`.
    fn skip(record: &Record, report: &mut ReconcileReport, why: &str) {
        transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, why, "not taken over");
        count_reconcile("skipped");
        report.skipped += 1;
    }

    /// Settles one listed record; see the module docs.
    pub(super) async fn settle(
        &self,
        record: &Record,
        report: &mut ReconcileReport,
    ) -> Result<(), StoreError> {
        let store = self.store;
        let id = record.id();
        let read_at = self.clock.now();
        let now = read_at;
        // Still the stale claim that was listed? If not, skip it without writing anything.
        let current = timed(store.backend(), "get", store.get(&id, now)).await?;
        let current = current.filter(|r| {
            r.token == record.token
                && r.fingerprint == record.fingerprint
                && r.is_stale_processing(now)
        });
        let Some(current) = current else {
            Self::skip(record, report, "no longer the stale claim that was listed");
            return Ok(());
        };
        // Take the record over: from here on the original holder is fenced out. `now` afresh,
        // so a record that expired since the read is not claimed at all.
        let now = self.clock.now();
        let Some(takeover) = takeover_policy(self.policy, &current, read_at, now) else {
            Self::skip(record, report, "expired or about to, or read too long ago");
            return Ok(());
        };
        let answer = timed(
            store.backend(),
            "claim",
            store.claim(&id, &record.fingerprint, &takeover, now),
        )
        .await?;
        match answer {
            ClaimAnswer::Claimed {
                token,
                kind: ClaimKind::TakenOver,
                ..
            } => self.probe_and_act(record, token, report).await,
            ClaimAnswer::Claimed { token, kind, .. } => {
                // Changed since the read: released or retried (now `failed_retryable`), expired
                // or purged. The claim was not won from a stale holder; give it straight back.
                // A record it created expires when the listed one did (see `takeover_policy`).
                let given_back = timed(
                    store.backend(),
                    "release",
                    store.release(&id, token, self.clock.now()),
                )
                .await?;
                transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, ?kind, ?given_back, "no longer stale; the claim was given back unprobed");
                count_reconcile("skipped");
                report.skipped += 1;
                Ok(())
            }
            answer => {
                transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, ?answer, "no longer stale");
                count_reconcile("skipped");
                report.skipped += 1;
                Ok(())
            }
        }
    }

    /// Asks the probe about the record the reconciler now holds under `token`, and acts.
    async fn probe_and_act(
        &self,
        record: &Record,
        token: Token,
        report: &mut ReconcileReport,
    ) -> Result<(), StoreError> {
        let store = self.store;
        let id = record.id();
        // The steps the operation saved, as they stand now that the old holder is fenced out,
        // decoded: the probe is asked about the step after the last one (contract §6.1).
        let after = timed(store.backend(), "get", store.get(&id, self.clock.now())).await?;
        let saved = after
            .filter(|r| r.token == token)
            .map_or_else(|| record.checkpoints.clone(), |r| r.checkpoints);
        let cx = CodecContext::new(&record.scope, &record.key);
        let decoded: Result<Vec<_>, _> = saved
            .iter()
            .map(|c| crate::checkpoint::decode_checkpoint(self.codec, &cx, c))
            .collect();
        let (checkpoints, finding) = match decoded {
            Ok(checkpoints) => (checkpoints, None),
            Err(e) => {
                tracing::error!(scope = %record.scope, key = %record.key, error = %e, "the record's checkpoints could not be decoded; not probed, left processing");
                (saved, Some(Finding::Unknown))
            }
        };
        let taken = Record {
            token,
            checkpoints,
            ..record.clone()
        };
        let finding = match finding {
            Some(finding) => finding,
            None => self.probe.probe(&taken).await,
        };
        match finding {
            Finding::Happened(outcome) => {
                let held = Held {
                    store,
                    codec: self.codec,
                    id: &id,
                    token,
                };
                let completion =
                    complete_or_not_kept(held, &outcome, self.policy, self.clock.now())
                        .await
                        .map_err(|e| match e {
                            CompletionError::Store(e) => e,
                            CompletionError::Encode(e) => {
                                StoreError::backend("the probe's outcome could not be encoded", e)
                            }
                        })?;
                if completion.answer == CompleteAnswer::Fenced {
                    count_reconcile("skipped");
                    report.skipped += 1;
                    return Ok(());
                }
                if let Some(e) = completion.not_kept {
                    transition!(WARN, "completed", scope = %taken.scope, key = %taken.key, status = outcome.status(), outcome_not_kept = true, size = e.size, limit = e.limit, "reconciled: the effect happened; its outcome is over the size limit, recorded as 'ran, response not kept'");
                    report.outcome_not_kept += 1;
                } else {
                    transition!(INFO, "completed", scope = %taken.scope, key = %taken.key, status = outcome.status(), "reconciled: the effect happened; outcome stored");
                }
                count_reconcile("completed");
                report.completed += 1;
            }
            Finding::NotHappened => {
                let released = timed(
                    store.backend(),
                    "release",
                    store.release(&id, token, self.clock.now()),
                )
                .await?;
                match released {
                    ReleaseAnswer::Released => {
                        transition!(INFO, "released", scope = %taken.scope, key = %taken.key, "reconciled: the effect did not happen; released for a retry");
                        count_reconcile("released");
                        report.released += 1;
                    }
                    ReleaseAnswer::Fenced => {
                        count_reconcile("skipped");
                        report.skipped += 1;
                    }
                }
            }
            Finding::Unknown => {
                transition!(WARN, "reconcile_unknown", scope = %taken.scope, key = %taken.key, "reconciliation: the probe cannot tell; left processing");
                count_reconcile("unknown");
                report.unknown.push(taken);
            }
        }
        Ok(())
    }
}
