//! [`ProtocolModel`]: the callers, the reconciler, the store and the clock as one
//! [`stateright::Model`].
//!
//! **Time is relative.** "Now" is always [`NOW`](crate::store::NOW); a tick moves every stored
//! instant (leases, expiries, waits) one tick into the past. The rules only compare instants with
//! now, so this is the same system, and its states repeat instead of counting up: the search is
//! exhaustive without a bound on the clock, and a lease or a ttl always can run out.

use std::sync::Arc;

use stateright::{Model, Property};

use crate::action::Action;
use crate::config::{Config, Replication};
use crate::machine::{Machine, Shipped};
use crate::properties;
use crate::state::{Caller, Ghost, Phase, Recon, State};
use crate::store::Rules;
use crate::{caller, reconciler};

/// The idem protocol within the bounds of a [`Config`].
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    rules: Rules,
}

impl ProtocolModel {
    /// The model of `cfg`, its store running the rules that ship (`idem_core::machine`).
    pub fn new(cfg: Config) -> Self {
        Self::with_machine(cfg, Shipped)
    }

    /// The model of `cfg`, its store running `machine`'s rules (a test's mutant of them).
    pub fn with_machine(cfg: Config, machine: impl Machine) -> Self {
        Self {
            rules: Rules::new(cfg, Arc::new(machine)),
        }
    }

    /// Its settings and bounds.
    pub fn config(&self) -> &Config {
        &self.rules.cfg
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.rules.cfg;
        let keys = cfg.keys();
        vec![State {
            callers: cfg
                .callers
                .iter()
                .map(|c| Caller {
                    calls_left: c.calls,
                    claims: 0,
                    phase: Phase::Idle,
                })
                .collect(),
            recon: Recon {
                passes_left: cfg.reconcile_passes,
                claims: 0,
                checked: None,
                holding: None,
            },
            primary: vec![None; keys],
            replica: vec![None; keys],
            crashes_left: cfg.crashes,
            failovers_left: cfg.failovers,
            ghost: Ghost {
                generation: vec![0; keys],
                acknowledged_expiry: vec![None; keys],
                effects: Vec::new(),
                first_completion: Vec::new(),
                open: vec![false; keys],
                unfenced_write: false,
                replayed: false,
                recreated: false,
                foreign_replay: false,
                replay_differs: false,
            },
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let rules = &self.rules;
        for i in 0..s.callers.len() {
            caller::actions(rules, s, u8::try_from(i).expect("few callers"), out);
        }
        reconciler::actions(rules, s, out);
        out.push(Action::Tick);
        for key in 0..s.primary.len() {
            let key = u8::try_from(key).expect("few keys");
            if Rules::found(s, key).is_some_and(|r| r.is_expired(crate::store::NOW)) {
                out.push(Action::Purge(key));
            }
        }
        if rules.cfg.replication == Replication::Asynchronous && s.primary != s.replica {
            out.push(Action::Replicate);
        }
        if s.failovers_left > 0 {
            out.push(Action::Failover);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let rules = &self.rules;
        let mut s = last.clone();
        match action {
            Action::Call(i)
            | Action::Wake(i)
            | Action::Effect(i)
            | Action::Checkpoint(i)
            | Action::Extend(i)
            | Action::ExtendShort(i)
            | Action::Complete(i)
            | Action::FailRetryable(i)
            | Action::Release(i)
            | Action::Crash(i) => caller::step(rules, &mut s, i, action),
            Action::ReconcileCheck(_) | Action::ReconcileTake | Action::ReconcileSettle(_) => {
                reconciler::step(rules, &mut s, action)
            }
            Action::Tick => rules.tick(&mut s),
            Action::Purge(key) => {
                rules.purge(&mut s, key);
            }
            Action::Replicate => s.replica = s.primary.clone(),
            Action::Failover => {
                s.failovers_left -= 1;
                s.primary = s.replica.clone();
            }
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(properties::AT_MOST_ONCE, |_, s| properties::at_most_once(s)),
            Property::always(properties::FENCING, |_, s| properties::fencing(s)),
            Property::always(properties::NO_FOREIGN_REPLAY, |_, s| {
                properties::no_foreign_replay(s)
            }),
            Property::always(properties::FIRST_OUTCOME, |_, s| {
                properties::first_outcome(s)
            }),
            Property::always(properties::EXPIRED_STAYS_GONE, |_, s| {
                properties::expired_stays_gone(s)
            }),
            Property::always(properties::CHECKPOINTS_END, |_, s| {
                properties::checkpoints_end(s)
            }),
            Property::always(properties::DEADLINES_BOUNDED, |m, s| {
                properties::deadlines_bounded(m.config(), s)
            }),
            Property::sometimes(properties::COMPLETES, |_, s| properties::completes(s)),
            Property::sometimes(properties::REPLAYS, |_, s| properties::replays(s)),
        ]
    }
}
