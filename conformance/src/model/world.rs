//! One sequence: the store, the model beside it, the translation between their tokens, and the
//! checks that compare them. The steps are played in `apply`, the races in `races`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use idem_core::machine::Transition;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, OutcomeClass, Record, RecordId, Scope,
    StoreError, Timestamp, Token,
};

use super::ops::{Addr, Holder, Op, Out};
use super::{KEYS, NEVER_ID, SCOPES};

mod apply;
mod checkpoint;
mod races;

/// One token handed out: as the store knows it, and as the model does.
#[derive(Debug, Clone, Copy)]
struct Issued {
    store: Token,
    model: Token,
}

/// One sequence: the store, the model, and the translation between their tokens.
pub(super) struct World {
    store: Arc<dyn KeyStore>,
    model: HashMap<Addr, Record>,
    scopes: Vec<Scope>,
    keys: Vec<IdempotencyKey>,
    requests: [Fingerprint; 2],
    now: Timestamp,
    /// Store token → model token, for every token the store handed out.
    tokens: HashMap<Token, Token>,
    /// The tokens handed out per address, oldest first.
    issued: HashMap<Addr, Vec<Issued>>,
    next_model_id: u128,
    step: usize,
    op: String,
}

type Checked<T = ()> = Result<T, String>;

impl World {
    pub(super) fn new(store: Arc<dyn KeyStore>, run: u64, sequence: u64, start: Timestamp) -> Self {
        let scopes = SCOPES
            .iter()
            .map(|s| {
                Scope::new(format!("idem-model/{run:016x}/{sequence}/{s}")).expect("valid scope")
            })
            .collect();
        let keys = KEYS
            .iter()
            .map(|k| IdempotencyKey::new(*k).expect("valid key"))
            .collect();
        let request = |title: &str| {
            Fingerprint::of("create_ticket", &serde_json::json!({ "title": title }))
                .expect("fingerprint")
        };
        Self {
            store,
            model: HashMap::new(),
            scopes,
            keys,
            requests: [request("A"), request("B")],
            now: start,
            tokens: HashMap::new(),
            issued: HashMap::new(),
            next_model_id: 2,
            step: 0,
            op: String::new(),
        }
    }

    fn fail<T>(&self, what: impl fmt::Display) -> Checked<T> {
        Err(format!(
            "step {} ({}), at {}: {what}",
            self.step, self.op, self.now
        ))
    }

    fn store_error<T>(&self, call: &str, e: StoreError) -> Checked<T> {
        self.fail(format!("{call} failed: {e}"))
    }

    /// Plays the sequence, then empties the namespace; returns the end time and step count.
    pub(super) async fn play(mut self, ops: Vec<Op>) -> Checked<(Timestamp, u64)> {
        for (i, op) in ops.iter().enumerate() {
            self.step = i + 1;
            self.op = op.to_string();
            self.apply(op).await?;
        }
        self.step = ops.len() + 1;
        self.op = "final check of every record".into();
        for scope in 0..SCOPES.len() {
            for key in 0..KEYS.len() {
                self.compare_record(Addr { scope, key }).await?;
            }
        }
        // Everything expires; purge it all in batches of 3 and check the counts.
        let end = self
            .model
            .values()
            .map(|r| r.expires_at)
            .max()
            .unwrap_or(self.now)
            .max(self.now);
        self.now = end;
        self.op = "clean-up: purge everything at the last expiry".into();
        self.purge(3).await?;
        if !self.model.is_empty() {
            return self.fail("the model kept records after the clean-up purge");
        }
        Ok((end, ops.len() as u64))
    }

    /// The record `at` names.
    fn id(&self, at: Addr) -> RecordId {
        RecordId::new(self.scopes[at.scope].clone(), self.keys[at.key].clone())
    }

    /// The record the model holds for `at`, as `get` must return it at `now`.
    fn model_live(&self, at: Addr) -> Option<Record> {
        self.model
            .get(&at)
            .filter(|r| !r.is_expired(self.now))
            .cloned()
    }

    fn write<A>(&mut self, at: Addr, t: Transition<A>) -> A {
        if let Some(record) = t.write {
            self.model.insert(at, record);
        }
        t.answer
    }

    /// The store's record, with its token translated to the model's.
    fn translate(&self, record: Record) -> Checked<Record> {
        match self.tokens.get(&record.token) {
            Some(model) => Ok(Record {
                token: *model,
                ..record
            }),
            None => self.fail(format!(
                "the store returned a record of ({}, {}) with token {:?}, which it never handed out",
                record.scope, record.key, record.token
            )),
        }
    }

    async fn compare_record(&self, at: Addr) -> Checked {
        let got = match self.store.get(&self.id(at), self.now).await {
            Ok(r) => r,
            Err(e) => return self.store_error("get", e),
        };
        let got = got.map(|r| self.translate(r)).transpose()?;
        let want = self.model_live(at);
        if got != want {
            return self.fail(format!(
                "get {at}: the store has\n    {got:?}\n  the model has\n    {want:?}"
            ));
        }
        Ok(())
    }

    /// The token a holder acts with: (for the store, for the model).
    fn token(&self, at: Addr, holder: &Holder) -> (Token, Token) {
        let never = Token::with_id(1, NEVER_ID);
        let issued = self.issued.get(&at).map(Vec::as_slice).unwrap_or_default();
        let Some(latest) = issued.last() else {
            return (never, never);
        };
        match holder {
            Holder::Latest => (latest.store, latest.model),
            Holder::Earlier(i) => {
                let t = issued[i.index(issued.len())];
                (t.store, t.model)
            }
            // Model ids are even, so `| 1` is no model token; a store id with its lowest bit
            // flipped is, with overwhelming probability, no store token.
            Holder::Forged => (
                Token::with_id(latest.store.seq, latest.store.id ^ 1),
                Token::with_id(latest.model.seq, latest.model.id | 1),
            ),
            Holder::Never => (never, never),
        }
    }

    fn outcome(out: Out) -> Outcome {
        match out {
            Out::Definitive(n) => Outcome::definitive(
                201,
                &serde_json::json!({ "ticket_id": format!("T-{n}"), "note": "é 😀 \"q\"" }),
            )
            .expect("outcome"),
            Out::Retryable => Outcome::new(
                503,
                &serde_json::json!({ "error": "upstream timeout" }),
                OutcomeClass::Retryable,
            )
            .expect("outcome"),
            Out::TooLarge => {
                Outcome::definitive(200, &serde_json::json!({ "body": "x".repeat(32) }))
                    .expect("outcome")
            }
        }
    }

    /// Purges in batches of `limit` until a batch is short, checking every count, then drops the
    /// expired records from the model.
    async fn purge(&mut self, limit: usize) -> Checked {
        let now = self.now;
        let mut left = self.model.values().filter(|r| r.is_expired(now)).count();
        // Bounded: a store that keeps answering `limit` must not loop forever.
        for batch in 1..=self.model.len() + 2 {
            let got = match self.store.purge_expired(now, limit).await {
                Ok(n) => n,
                Err(e) => return self.store_error("purge_expired", e),
            };
            let want = left.min(limit);
            if got != want {
                return self.fail(format!(
                    "purge_expired({now}, {limit}), batch {batch}: the store deleted {got}, the model expected {want} ({left} expired records left)"
                ));
            }
            left -= got;
            if got < limit {
                self.model.retain(|_, r| !r.is_expired(now));
                return Ok(());
            }
        }
        self.fail(format!(
            "purge_expired({now}, {limit}) kept answering {limit}"
        ))
    }
}
