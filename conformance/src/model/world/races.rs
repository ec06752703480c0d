//! The races: `n` identical claims at once, and a holder's act at the same time as `n` claims.

use idem_core::machine::{self, ClaimAnswer, ClaimRequest, Transition};
use idem_core::{KeyStore, Policy, Record, StoreError, Timestamp, Token};

use super::{Checked, Issued, World};
use crate::model::EXTENDS;
use crate::model::ops::{Act, Acted, Addr, Holder, Pol};

impl World {
    /// `n` identical claims at once: the model's answers are those of the same claims one after
    /// another (the first may win; the others then see it in flight), the store's must be the
    /// same, in any order.
    pub(super) async fn claim_race(&mut self, at: Addr, n: usize, pol: Pol) -> Checked {
        let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
        let fingerprint = self.requests[0].clone();
        let id = self.id(at);
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (store, id, fingerprint) =
                    (self.store.clone(), id.clone(), fingerprint.clone());
                let now = self.now;
                tokio::spawn(async move { store.claim(&id, &fingerprint, &policy, now).await })
            })
            .collect();
        let mut got = Vec::with_capacity(n);
        for task in tasks {
            match task.await {
                Ok(Ok(answer)) => got.push(answer),
                Ok(Err(e)) => return self.store_error("claim", e),
                Err(join) => return self.fail(format!("a claim task failed: {join}")),
            }
        }
        let mut want = Vec::with_capacity(n);
        for _ in 0..n {
            let token_id = self.next_model_id;
            self.next_model_id += 2;
            let req = ClaimRequest {
                token_id,
                ..ClaimRequest::new(&id, &fingerprint)
            };
            let t = machine::claim(self.model.get(&at), req, self.now, &policy);
            want.push(self.write(at, t));
        }
        let won = |a: &ClaimAnswer| matches!(a, ClaimAnswer::Claimed { .. });
        let mismatch = |this: &Self| {
            this.fail::<()>(format!(
                "{n} concurrent claims of {at}: the store answered\n    {got:?}\n  the model (in some order)\n    {want:?}"
            ))
        };
        let got_won: Vec<&ClaimAnswer> = got.iter().filter(|a| won(a)).collect();
        let want_won: Vec<&ClaimAnswer> = want.iter().filter(|a| won(a)).collect();
        if got_won.len() != want_won.len() {
            return mismatch(self);
        }
        if let (
            [
                ClaimAnswer::Claimed {
                    token: st,
                    attempt: sa,
                    kind: sk,
                },
            ],
            [
                ClaimAnswer::Claimed {
                    token: mt,
                    attempt: ma,
                    kind: mk,
                },
            ],
        ) = (got_won.as_slice(), want_won.as_slice())
        {
            if sa != ma || sk != mk || st.seq != mt.seq {
                return mismatch(self);
            }
            if self.tokens.contains_key(st) {
                return self.fail(format!("the store handed out token {st:?} a second time"));
            }
            self.tokens.insert(*st, *mt);
            self.issued.entry(at).or_default().push(Issued {
                store: *st,
                model: *mt,
            });
        }
        let mut rest: Vec<&ClaimAnswer> = want.iter().filter(|a| !won(a)).collect();
        for answer in got.iter().filter(|a| !won(a)) {
            match rest.iter().position(|w| *w == answer) {
                Some(i) => {
                    rest.swap_remove(i);
                }
                None => return mismatch(self),
            }
        }
        self.compare_record(at).await
    }

    /// The model's rule for a holder's act on `found`.
    fn act_rule(
        found: Option<&Record>,
        act: Act,
        token: Token,
        now: Timestamp,
        policy: &Policy,
    ) -> Transition<Acted> {
        let wrap = |write, answer| Transition { answer, write };
        match act {
            Act::Complete(out) => {
                let t = machine::complete(found, token, &Self::outcome(out), now, policy)
                    .expect("race outcomes are within the limit");
                wrap(t.write, Acted::Complete(t.answer))
            }
            Act::Release => {
                let t = machine::release(found, token, now);
                wrap(t.write, Acted::Release(t.answer))
            }
            Act::Extend(lease) => {
                let t = machine::extend(found, token, EXTENDS[lease], now)
                    .expect("the model's leases are not zero");
                wrap(t.write, Acted::Extend(t.answer))
            }
        }
    }

    /// A holder's act and `n` identical claims at once. The store's answers and record must be
    /// those of one serial order: the act after `k` of the claims, for some `k` in `0..=n`.
    pub(super) async fn holder_race(
        &mut self,
        at: Addr,
        holder: &Holder,
        act: Act,
        n: usize,
        pol: Pol,
    ) -> Checked {
        let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
        let fingerprint = self.requests[0].clone();
        let id = self.id(at);
        let (st, mt) = self.token(at, holder);
        let now = self.now;

        let acting = {
            let (store, id) = (self.store.clone(), id.clone());
            tokio::spawn(async move {
                Ok::<_, StoreError>(match act {
                    Act::Complete(out) => Acted::Complete(
                        store
                            .complete(&id, st, &Self::outcome(out), &policy, now)
                            .await?,
                    ),
                    Act::Release => Acted::Release(store.release(&id, st, now).await?),
                    Act::Extend(lease) => {
                        Acted::Extend(store.extend(&id, st, EXTENDS[lease], now).await?)
                    }
                })
            })
        };
        let claims: Vec<_> = (0..n)
            .map(|_| {
                let (store, id, fingerprint) =
                    (self.store.clone(), id.clone(), fingerprint.clone());
                tokio::spawn(async move { store.claim(&id, &fingerprint, &policy, now).await })
            })
            .collect();
        let got_act = match acting.await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return self.store_error("the holder's call", e),
            Err(join) => return self.fail(format!("the holder's task failed: {join}")),
        };
        let mut got = Vec::with_capacity(n);
        for task in claims {
            match task.await {
                Ok(Ok(answer)) => got.push(answer),
                Ok(Err(e)) => return self.store_error("claim", e),
                Err(join) => return self.fail(format!("a claim task failed: {join}")),
            }
        }
        let stored = match self.store.get(&id, now).await {
            Ok(r) => r,
            Err(e) => return self.store_error("get", e),
        };

        let won = |a: &ClaimAnswer| matches!(a, ClaimAnswer::Claimed { .. });
        let first_id = self.next_model_id;
        self.next_model_id += 2 * n as u128 + 2;
        let mut orders = Vec::new();
        for k in 0..=n {
            let mut record = self.model.get(&at).cloned();
            let mut answers = Vec::with_capacity(n);
            let mut acted = None;
            for i in 0..=n {
                if i == k {
                    let t = Self::act_rule(record.as_ref(), act, mt, now, &policy);
                    if let Some(w) = t.write {
                        record = Some(w);
                    }
                    acted = Some(t.answer);
                }
                if i == n {
                    break;
                }
                let req = ClaimRequest {
                    token_id: first_id + 2 * i as u128,
                    ..ClaimRequest::new(&id, &fingerprint)
                };
                let t = machine::claim(record.as_ref(), req, now, &policy);
                if let Some(w) = t.write {
                    record = Some(w);
                }
                answers.push(t.answer);
            }
            let acted = acted.expect("the act is in every order");
            orders.push((k, acted, answers, record));
        }

        for (_, acted, want, record) in &orders {
            if *acted != got_act {
                continue;
            }
            let got_won: Vec<&ClaimAnswer> = got.iter().filter(|a| won(a)).collect();
            let want_won: Vec<&ClaimAnswer> = want.iter().filter(|a| won(a)).collect();
            if got_won.len() != want_won.len() {
                continue;
            }
            let mut pair = None;
            if let (
                [
                    ClaimAnswer::Claimed {
                        token: gt,
                        attempt: ga,
                        kind: gk,
                    },
                ],
                [
                    ClaimAnswer::Claimed {
                        token: wt,
                        attempt: wa,
                        kind: wk,
                    },
                ],
            ) = (got_won.as_slice(), want_won.as_slice())
            {
                if ga != wa || gk != wk || gt.seq != wt.seq || self.tokens.contains_key(gt) {
                    continue;
                }
                pair = Some((*gt, *wt));
            }
            let mut rest: Vec<&ClaimAnswer> = want.iter().filter(|a| !won(a)).collect();
            let others_match =
                got.iter()
                    .filter(|a| !won(a))
                    .all(|a| match rest.iter().position(|w| *w == a) {
                        Some(i) => {
                            rest.swap_remove(i);
                            true
                        }
                        None => false,
                    });
            if !others_match {
                continue;
            }
            // The store's record with its token translated (`None`: a token nobody was handed).
            let translated: Option<Option<Record>> = match stored.clone() {
                None => Some(None),
                Some(mut r) => {
                    let model_token = match pair {
                        Some((gt, wt)) if r.token == gt => Some(wt),
                        _ => self.tokens.get(&r.token).copied(),
                    };
                    model_token.map(|t| {
                        r.token = t;
                        Some(r)
                    })
                }
            };
            if translated != Some(record.clone().filter(|r| !r.is_expired(now))) {
                continue;
            }
            // This order explains everything the store did: adopt it.
            if let Some((gt, wt)) = pair {
                self.tokens.insert(gt, wt);
                self.issued.entry(at).or_default().push(Issued {
                    store: gt,
                    model: wt,
                });
            }
            match record {
                Some(r) => {
                    self.model.insert(at, r.clone());
                }
                None => {
                    self.model.remove(&at);
                }
            }
            return Ok(());
        }
        let orders: Vec<String> = orders
            .iter()
            .map(|(k, acted, answers, record)| {
                format!("    after {k} claims: {acted:?}, claims {answers:?}, record {record:?}")
            })
            .collect();
        self.fail(format!(
            "no serial order explains what the store did: the holder got {got_act:?}, the claims \
             {got:?}, and the record is\n    {stored:?}\n  the orders the model allows:\n{}",
            orders.join("\n")
        ))
    }
}
