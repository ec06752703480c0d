//! Plays one step on the store and on the model and compares the answers.

use std::collections::HashSet;
use std::time::Duration;

use idem_core::machine::{self, ClaimAnswer, ClaimRequest};
use idem_core::store::ListFilter;
use idem_core::{KeyStore, Policy, Record, StoreError, Timestamp};

use super::{Checked, Issued, World};
use crate::model::ops::{Op, Out};
use crate::model::{EXTENDS, SMALL_LIMIT};

impl World {
    pub(super) async fn apply(&mut self, op: &Op) -> Checked {
        let store = self.store.clone();
        let now = self.now;
        match op {
            Op::Advance { ms } => {
                self.now = self.now + Duration::from_millis(*ms);
            }
            Op::Claim {
                at,
                other_request,
                pol,
            } => {
                let at = *at;
                let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
                let fingerprint = self.requests[usize::from(*other_request)].clone();
                let id = self.id(at);
                let token_id = self.next_model_id;
                self.next_model_id += 2;
                let req = ClaimRequest {
                    token_id,
                    ..ClaimRequest::new(&id, &fingerprint)
                };
                let t = machine::claim(self.model.get(&at), req, now, &policy);
                let got = match store.claim(&id, &fingerprint, &policy, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("claim", e),
                };
                let want = t.answer.clone();
                match (&got, &want) {
                    (
                        ClaimAnswer::Claimed {
                            token: st,
                            attempt: sa,
                            kind: sk,
                        },
                        ClaimAnswer::Claimed {
                            token: mt,
                            attempt: ma,
                            kind: mk,
                        },
                    ) if sa == ma && sk == mk && st.seq == mt.seq => {
                        if self.tokens.contains_key(st) {
                            return self
                                .fail(format!("the store handed out token {st:?} a second time"));
                        }
                        self.tokens.insert(*st, *mt);
                        self.issued.entry(at).or_default().push(Issued {
                            store: *st,
                            model: *mt,
                        });
                    }
                    _ if got == want => {}
                    _ => {
                        return self.fail(format!(
                            "claim {at}: the store answered\n    {got:?}\n  the model\n    {want:?}"
                        ));
                    }
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::Complete {
                at,
                holder,
                out,
                pol,
            } => {
                let at = *at;
                let limit = match out {
                    Out::TooLarge => SMALL_LIMIT,
                    _ => Policy::DEFAULT_MAX_OUTCOME_BYTES,
                };
                let policy = pol.policy(limit);
                let outcome = Self::outcome(*out);
                let (st, mt) = self.token(at, holder);
                let got = store
                    .complete(&self.id(at), st, &outcome, &policy, now)
                    .await;
                let t = machine::complete(self.model.get(&at), mt, &outcome, now, &policy);
                match (got, t) {
                    (Ok(got), Ok(t)) if got == t.answer => {
                        self.write(at, t);
                    }
                    (Err(StoreError::OutcomeTooLarge(got)), Err(want)) if got == want => {}
                    (got, want) => {
                        let want = want.map(|t| t.answer);
                        return self.fail(format!(
                            "complete {at}: the store answered\n    {got:?}\n  the model\n    {want:?}"
                        ));
                    }
                }
                self.compare_record(at).await?;
            }
            Op::Release { at, holder } => {
                let at = *at;
                let (st, mt) = self.token(at, holder);
                let got = match store.release(&self.id(at), st, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("release", e),
                };
                let t = machine::release(self.model.get(&at), mt, now);
                if got != t.answer {
                    return self.fail(format!(
                        "release {at}: the store answered {got:?}, the model {:?}",
                        t.answer
                    ));
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::Extend { at, holder, lease } => {
                let at = *at;
                let lease = EXTENDS[*lease];
                let (st, mt) = self.token(at, holder);
                let got = match store.extend(&self.id(at), st, lease, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("extend", e),
                };
                let t = machine::extend(self.model.get(&at), mt, lease, now)
                    .expect("the model's leases are not zero");
                if got != t.answer {
                    return self.fail(format!(
                        "extend {at}: the store answered {got:?}, the model {:?}",
                        t.answer
                    ));
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::ClaimRace { at, n, pol } => self.claim_race(*at, *n, *pol).await?,
            Op::HolderRace {
                at,
                holder,
                act,
                n,
                pol,
            } => self.holder_race(*at, holder, *act, *n, *pol).await?,
            Op::Checkpoint {
                at,
                holder,
                step,
                too_large,
            } => self.checkpoint(*at, holder, *step, *too_large).await?,
            Op::Get { at } => self.compare_record(*at).await?,
            Op::List {
                state,
                scope,
                age_ms,
                limit,
            } => {
                let filter = ListFilter {
                    state: *state,
                    scope: scope.map(|s| self.scopes[s].clone()),
                    updated_before: age_ms.map(|a| now - Duration::from_millis(a)),
                };
                let got = match store.list(&filter, now, *limit).await {
                    Ok(l) => l,
                    Err(e) => return self.store_error("list", e),
                };
                let got = got
                    .into_iter()
                    .map(|r| self.translate(r))
                    .collect::<Checked<Vec<_>>>()?;
                let mut want: Vec<Record> = self
                    .model
                    .values()
                    .filter(|r| filter.matches(r, now))
                    .cloned()
                    .collect();
                ListFilter::order_and_truncate(&mut want, *limit);
                if got != want {
                    return self.fail(format!(
                        "list: the store returned\n{}\n  the model\n{}",
                        lines(&got),
                        lines(&want)
                    ));
                }
            }
            Op::ListInFlight { back_ms, limit } => {
                let older_than = now - Duration::from_millis(*back_ms);
                let got = match store.list_in_flight(older_than, *limit).await {
                    Ok(l) => l,
                    Err(e) => return self.store_error("list_in_flight", e),
                };
                let got = got
                    .into_iter()
                    .map(|r| self.translate(r))
                    .collect::<Checked<Vec<_>>>()?;
                let mut eligible: Vec<Record> = self
                    .model
                    .values()
                    .filter(|r| r.is_stale_processing(older_than))
                    .cloned()
                    .collect();
                eligible.sort_by(|a, b| {
                    (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
                });
                // Earliest lease first; among equal leases any order (and, at the limit, any
                // choice) is right.
                let want_leases: Vec<Timestamp> = eligible
                    .iter()
                    .take(*limit)
                    .map(|r| r.lease_until)
                    .collect();
                let got_leases: Vec<Timestamp> = got.iter().map(|r| r.lease_until).collect();
                let mut seen = HashSet::new();
                let all_eligible = got
                    .iter()
                    .all(|r| eligible.contains(r) && seen.insert((r.scope.clone(), r.key.clone())));
                if got_leases != want_leases || !all_eligible {
                    return self.fail(format!(
                        "list_in_flight({older_than}, {limit}): the store returned\n{}\n  the model's stale records are\n{}",
                        lines(&got),
                        lines(&eligible)
                    ));
                }
            }
            Op::Purge { limit } => self.purge(*limit).await?,
        }
        Ok(())
    }
}

fn lines(records: &[Record]) -> String {
    if records.is_empty() {
        return "    (none)".to_owned();
    }
    records
        .iter()
        .map(|r| format!("    {r:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}
