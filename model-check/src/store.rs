//! The model's store: each operation runs its [`Machine`]'s rule (`idem_core::machine`'s, unless
//! a test seeds a mutant) on the record the primary holds and writes what the rule says, to the
//! primary and (when writes are acknowledged after the replica confirmed them) to the replica:
//! claims, completions, releases, extends and checkpoints, and with them the checkpoints'
//! lifetime (kept by a retry, a takeover, a release and a retryable outcome; dropped by completion
//! and by a record that replaces an expired one). The ghost variables are kept here too.

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{
    CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::{
    Checkpoint, Fingerprint, IdempotencyKey, Outcome, Policy, Record, RecordState, Scope,
    Timestamp, Token,
};

use crate::config::{Config, Replication};
use crate::machine::Machine;
use crate::state::{Phase, State, Stored};

pub use crate::state::NOW;

/// The fixed parts of a model: names, policies, and the store operations over them.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The settings and bounds.
    pub cfg: Config,
    scope: Scope,
    keys: Vec<IdempotencyKey>,
    requests: Vec<Fingerprint>,
    /// The callers' policy (the reconciler's too: it derives its takeover's from it).
    pub policy: Policy,
    /// The earliest instant a tick keeps: anything earlier behaves the same (long past).
    floor: Timestamp,
    /// The transition rules each store operation runs.
    machine: Arc<dyn Machine>,
}

impl Rules {
    /// The rules for `cfg`, each store operation running `machine`'s rule.
    pub fn new(cfg: Config, machine: Arc<dyn Machine>) -> Self {
        let ms = Duration::from_millis;
        let policy = Policy::builder()
            .lease(ms(cfg.lease))
            .ttl(ms(cfg.ttl.unwrap_or(u64::MAX)))
            .stale(cfg.stale)
            .build()
            .expect("a lease of at least one tick and a ttl above it");
        let horizon = cfg.ttl.unwrap_or(cfg.lease).max(cfg.lease) + 2;
        Self {
            scope: Scope::new("tenant/tool").expect("a valid scope"),
            keys: (0..cfg.keys())
                .map(|k| IdempotencyKey::new(format!("k{k}")).expect("a valid key"))
                .collect(),
            requests: (0..cfg.requests())
                .map(|r| Fingerprint::of_bytes(format!("request-{r}").as_bytes()))
                .collect(),
            policy,
            floor: NOW - ms(horizon),
            cfg,
            machine,
        }
    }

    /// The record the primary holds for `key`, expired or not.
    pub fn found(s: &State, key: u8) -> Option<&Record> {
        s.primary[usize::from(key)].as_ref().map(|s| &s.record)
    }

    /// The request index of a fingerprint.
    pub fn request_of(&self, fingerprint: &Fingerprint) -> u8 {
        let index = self.requests.iter().position(|f| f == fingerprint);
        u8::try_from(index.expect("a request of the model")).expect("few requests")
    }

    /// The outcome an attempt records: its request and its writer (the token id) in the body.
    pub fn outcome(request: u8, writer: Token, definitive: bool) -> Outcome {
        let body = [u128::from(request), writer.id];
        let outcome = if definitive {
            Outcome::definitive(200, &body)
        } else {
            Outcome::retryable(503, &body)
        };
        outcome.expect("a JSON body")
    }

    /// The request and writer an outcome of [`Rules::outcome`] names.
    pub fn outcome_origin(outcome: &Outcome) -> (u8, u128) {
        let [request, writer]: [u128; 2] =
            serde_json::from_str(outcome.body()).expect("a body the model wrote");
        (u8::try_from(request).expect("few requests"), writer)
    }

    fn write(&self, s: &mut State, key: u8, stored: Option<Stored>) {
        let k = usize::from(key);
        if let Some(new) = &stored {
            s.ghost.acknowledged_expiry[k] = Some(new.record.expires_at);
        }
        if self.cfg.replication == Replication::Acknowledged {
            s.replica[k] = stored.clone();
        }
        s.primary[k] = stored;
    }

    fn note_writer(s: &mut State, key: u8, writer: Token) {
        if Self::found(s, key).is_some_and(|r| r.token != writer) {
            s.ghost.unfenced_write = true;
        }
    }

    /// `claim` under `policy` (the callers', or the reconciler's takeover policy). Returns the
    /// answer and the operation's generation of a won claim.
    pub fn claim(
        &self,
        s: &mut State,
        key: u8,
        request: u8,
        token_id: u128,
        policy: &Policy,
    ) -> (ClaimAnswer, u8) {
        let k = usize::from(key);
        let req = ClaimRequest {
            scope: &self.scope,
            key: &self.keys[k],
            fingerprint: &self.requests[usize::from(request)],
            token_id,
        };
        let t = self.machine.claim(Self::found(s, key), req, NOW, policy);
        if let Some(record) = t.write {
            if s.ghost.acknowledged_expiry[k].is_none_or(|e| NOW >= e) {
                s.ghost.generation[k] += 1;
            }
            s.ghost.open[k] = true;
            self.write(s, key, Some(Stored { record }));
        }
        (t.answer, s.ghost.generation[k])
    }

    /// `complete` with `outcome` by the holder of `token`.
    pub fn complete(
        &self,
        s: &mut State,
        key: u8,
        token: Token,
        outcome: &Outcome,
    ) -> CompleteAnswer {
        let k = usize::from(key);
        let t = self
            .machine
            .complete(Self::found(s, key), token, outcome, NOW, &self.policy)
            .expect("a small outcome");
        if let Some(record) = t.write {
            Self::note_writer(s, key, token);
            if record.state == RecordState::Completed {
                let generation = s.ghost.generation[k];
                if s.ghost.first(key, generation).is_none() {
                    let (_, writer) = Self::outcome_origin(outcome);
                    s.ghost.first_completion.push((key, generation, writer));
                }
            }
            s.ghost.open[k] = false;
            self.write(s, key, Some(Stored { record }));
        }
        t.answer
    }

    /// `release` by the holder of `token`.
    pub fn release(&self, s: &mut State, key: u8, token: Token) -> ReleaseAnswer {
        let t = self.machine.release(Self::found(s, key), token, NOW);
        if let Some(record) = t.write {
            Self::note_writer(s, key, token);
            s.ghost.open[usize::from(key)] = false;
            self.write(s, key, Some(Stored { record }));
        }
        t.answer
    }

    /// `extend` by `lease`, by the holder of `token`.
    pub fn extend(&self, s: &mut State, key: u8, token: Token, lease: Duration) -> ExtendAnswer {
        let t = self
            .machine
            .extend(Self::found(s, key), token, lease, NOW)
            .expect("a lease");
        if let Some(record) = t.write {
            Self::note_writer(s, key, token);
            self.write(s, key, Some(Stored { record }));
        }
        t.answer
    }

    /// `checkpoint` by the holder of `token` (`Machine::checkpoint`): the next step, named by
    /// its index, its value the token of the claim that saved it. Whether it was saved.
    pub fn checkpoint(&self, s: &mut State, key: u8, token: Token) -> bool {
        let found = Self::found(s, key);
        let step = found.map_or(0, |r| r.checkpoints.len());
        let checkpoint = Checkpoint::new(format!("step-{step}"), format!("\"{}\"", token.id), NOW)
            .expect("a JSON string");
        let t = self
            .machine
            .checkpoint(found, token, &checkpoint, &self.policy)
            .expect("a small checkpoint");
        let Some(record) = t.write else {
            return false;
        };
        Self::note_writer(s, key, token);
        self.write(s, key, Some(Stored { record }));
        t.answer == CheckpointAnswer::Saved
    }

    /// `purge_expired` for one key: deletes its record if it has expired.
    pub fn purge(&self, s: &mut State, key: u8) -> bool {
        if !Self::found(s, key).is_some_and(|r| r.is_expired(NOW)) {
            return false;
        }
        let k = usize::from(key);
        if self.cfg.replication == Replication::Acknowledged {
            s.replica[k] = None;
        }
        s.primary[k] = None;
        true
    }

    /// One tick of the clock: every stored instant moves one tick into the past, down to the
    /// floor (instants before it all read as "long past": no rule tells them apart, since a
    /// live `processing` record's lease is never more than a ttl behind its expiry). The far end
    /// of time (a record that never expires) stays.
    pub fn tick(&self, s: &mut State) {
        let floor = self.floor;
        let back = |t: &mut Timestamp| {
            if *t != Timestamp::from_millis(u64::MAX) {
                *t = (*t - Duration::from_millis(1)).max(floor);
            }
        };
        for stored in s.primary.iter_mut().chain(s.replica.iter_mut()).flatten() {
            let r = &mut stored.record;
            for t in [
                &mut r.lease_until,
                &mut r.expires_at,
                &mut r.created_at,
                &mut r.updated_at,
            ] {
                back(t);
            }
        }
        // Where only "has it passed?" is ever asked, a passed instant is the floor.
        let passed = |t: &mut Timestamp| {
            back(t);
            if *t <= NOW {
                *t = floor;
            }
        };
        for e in s.ghost.acknowledged_expiry.iter_mut().flatten() {
            passed(e);
        }
        if let Some(checked) = &mut s.recon.checked {
            back(&mut checked.record.expires_at);
            back(&mut checked.read_at);
        }
        for c in &mut s.callers {
            match &mut c.phase {
                Phase::Waiting { seen, until } => {
                    back(&mut seen.0.lease_until);
                    back(&mut seen.0.updated_at);
                    passed(until);
                }
                Phase::Holding(h) => passed(&mut h.lease_until),
                Phase::Idle => {}
            }
        }
    }
}
