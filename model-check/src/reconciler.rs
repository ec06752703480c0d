//! The reconciler ([contract §6](idem_core::contract#beyond-one-call),
//! `idem_core::reconcile::Reconciler`): reads a stale `processing` record back, takes it over with
//! a fresh token (`claim` under `idem_core::reconcile::takeover_policy`: the record's own expiry,
//! within a lease of the read), asks the probe, and completes (found), releases (not found) or
//! leaves the record (unknown).
//!
//! The probe tells the truth or says "unknown". It is asked about the step after the last
//! checkpoint ([contract §6.1](idem_core::contract#checkpoints)); with checkpoints, a step it finds
//! is saved as a checkpoint by the reconciler (under its token) and the next step is asked about,
//! so a half-done operation is settled too. Without checkpoints it is asked about the whole
//! operation, and a half-done one is "unknown": nothing may guess.

use idem_core::StalePolicy;
use idem_core::machine::{ClaimAnswer, ClaimKind};
use idem_core::reconcile::takeover_policy;

use crate::action::{Action, Finding};
use crate::state::{Checked, ReconHold, State};
use crate::store::{NOW, Rules};

/// The steps the reconciler can take in `s`.
pub fn actions(rules: &Rules, s: &State, out: &mut Vec<Action>) {
    if s.recon.checked.is_some() {
        out.push(Action::ReconcileTake);
        return;
    }
    match s.recon.holding {
        None if s.recon.passes_left > 0 => {
            for key in 0..s.primary.len() {
                let key = u8::try_from(key).expect("few keys");
                if Rules::found(s, key).is_some_and(|r| r.is_stale_processing(NOW)) {
                    out.push(Action::ReconcileCheck(key));
                }
            }
        }
        None => {}
        Some(held) => {
            let (found, not_found) = truths(rules, s, held);
            if found {
                out.push(Action::ReconcileSettle(Finding::Found));
            }
            if not_found {
                out.push(Action::ReconcileSettle(Finding::NotFound));
            }
            if rules.cfg.probe_unknown || !(found || not_found) {
                out.push(Action::ReconcileSettle(Finding::Unknown));
            }
        }
    }
}

/// The first step not covered by a checkpoint of the record `held`, if it still holds it.
fn resume_at(s: &State, held: ReconHold) -> u8 {
    s.primary[usize::from(held.key)]
        .as_ref()
        .filter(|st| st.record.token == held.token)
        .map_or(0, |st| {
            u8::try_from(st.record.checkpoints.len()).expect("few checkpoints")
        })
}

/// What a truthful probe may answer: (found, not found).
fn truths(rules: &Rules, s: &State, held: ReconHold) -> (bool, bool) {
    let happened = |step: u8| s.ghost.effect_count(held.key, held.generation, step) > 0;
    if rules.cfg.checkpoints {
        let step = resume_at(s, held);
        (happened(step), !happened(step))
    } else {
        let steps = 0..rules.cfg.effects;
        (
            steps.clone().all(happened),
            !steps.into_iter().any(happened),
        )
    }
}

/// Takes step `action` of the reconciler.
pub fn step(rules: &Rules, s: &mut State, action: Action) {
    match action {
        Action::ReconcileCheck(key) => {
            let record = Rules::found(s, key).expect("a stale record");
            s.recon.checked = Some(Checked {
                key,
                request: rules.request_of(&record.fingerprint),
                record: record.clone(),
                read_at: NOW,
            });
            if !rules.cfg.reconcile_reads_first {
                take(rules, s);
            }
        }
        Action::ReconcileTake => take(rules, s),
        Action::ReconcileSettle(finding) => {
            let held = s.recon.holding.take().expect("a record taken over");
            match finding {
                Finding::Found => {
                    let step = resume_at(s, held);
                    if rules.cfg.checkpoints && step + 1 < rules.cfg.effects {
                        if rules.checkpoint(s, held.key, held.token) {
                            s.recon.holding = Some(held);
                        }
                    } else {
                        let outcome = Rules::outcome(held.request, held.token, true);
                        rules.complete(s, held.key, held.token, &outcome);
                    }
                }
                Finding::NotFound => {
                    rules.release(s, held.key, held.token);
                }
                Finding::Unknown => {}
            }
        }
        _ => unreachable!("not a reconciler's step: {action:?}"),
    }
}

/// The takeover claim of the record the reconciler checked, under the record's own expiry
/// (`takeover_policy`; none once it has expired or the read is a lease old): won from a stale
/// holder, it holds it (one pass spent); won any other way (the record changed since it was
/// read), it gives it straight back, unprobed, as `idem_core::reconcile::Reconciler` does. With
/// `reconcile_own_expiry` off, the claim is the reconciler's before that rule: the callers'
/// policy under takeover, whatever the record has left.
fn take(rules: &Rules, s: &mut State) {
    let checked = s.recon.checked.take().expect("a checked record");
    let (key, request) = (checked.key, checked.request);
    let policy = if rules.cfg.reconcile_own_expiry {
        takeover_policy(&rules.policy, &checked.record, checked.read_at, NOW)
    } else {
        rules
            .policy
            .to_builder()
            .stale(StalePolicy::Takeover)
            .build()
            .ok()
    };
    let Some(policy) = policy else {
        return;
    };
    let reconciler = u128::try_from(s.callers.len()).expect("few callers") + 1;
    let token_id = reconciler << 8 | u128::from(s.recon.claims);
    let (answer, generation) = rules.claim(s, key, request, token_id, &policy);
    match answer {
        ClaimAnswer::Claimed {
            token,
            kind: ClaimKind::TakenOver,
            ..
        } => {
            s.recon.passes_left -= 1;
            s.recon.claims += 1;
            s.recon.holding = Some(ReconHold {
                key,
                request,
                token,
                generation,
            });
        }
        ClaimAnswer::Claimed { token, kind, .. } => {
            if matches!(kind, ClaimKind::New | ClaimKind::ExpiredReplaced) {
                s.ghost.recreated = true;
            }
            s.recon.claims += 1;
            rules.release(s, key, token);
        }
        _ => {}
    }
}
