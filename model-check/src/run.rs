//! Running the checker: one breadth-first search, exhaustive unless it meets a counterexample,
//! and what it found.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::action::Action;
use crate::model::ProtocolModel;
use crate::state::{Phase, State};
use crate::store::{NOW, Rules};

/// What one search found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states explored.
    pub unique_states: usize,
    /// States generated, repeats included.
    pub states: usize,
    /// The deepest path explored.
    pub max_depth: usize,
    /// How long the search took.
    pub elapsed: Duration,
    /// The safety properties found failing before the search stopped (the first one found,
    /// usually alone), each with its counterexample: the steps from the start to the first state
    /// that breaks it (each state with the action taken from it). Empty: none fails in any
    /// reachable state.
    pub violations: BTreeMap<&'static str, Vec<(State, Option<Action>)>>,
    /// The reachability properties with no example; only known, and so only listed, when the
    /// search covered every state.
    pub unreached: Vec<&'static str>,
}

impl Report {
    /// The counterexample of `property`, written out step by step, if the search found one.
    pub fn trace(&self, property: &str) -> Option<String> {
        self.violations.get(property).map(|steps| describe(steps))
    }
}

/// Searches the states of `model` breadth-first on every core, and stops at the first
/// counterexample to any safety property: a broken rule is thus reported in about the time its
/// counterexample takes to reach, whatever the size of the space it opens. Where no property
/// fails, every reachable state is searched. (Stateright looks for the stop every 1,500 states
/// and keeps the last counterexample it met, so one may be a few steps longer than the shortest,
/// and another property may be found failing in the same stretch.)
pub fn check(model: ProtocolModel) -> Report {
    let model_for_check = model.clone();
    let properties = model.properties();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let mut discoveries = checker.discoveries();
    let stopped = properties
        .iter()
        .any(|p| p.expectation.discovery_is_failure() && discoveries.contains_key(p.name));
    let mut violations = BTreeMap::new();
    let mut unreached = Vec::new();
    for p in &properties {
        let found = discoveries.remove(p.name);
        match (p.expectation.discovery_is_failure(), found) {
            (true, Some(path)) => {
                let mut steps = path.into_vec();
                let first = steps
                    .iter()
                    .position(|(s, _)| !(p.condition)(&model_for_check, s));
                steps.truncate(first.map_or(steps.len(), |i| i + 1));
                if let Some(last) = steps.last_mut() {
                    last.1 = None;
                }
                violations.insert(p.name, steps);
            }
            (false, None) if !stopped => unreached.push(p.name),
            _ => {}
        }
    }
    Report {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        violations,
        unreached,
    }
}

/// Steps written out: each action, then the store, the actors and what ran downstream after it.
pub fn describe(steps: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    for (i, pair) in steps.windows(2).enumerate() {
        if let (Some(action), (after, _)) = (&pair[0].1, &pair[1]) {
            let _ = writeln!(out, "{:>3}. {action:?}", i + 1);
            out.push_str(&summary(after));
        }
    }
    out
}

/// One state in a few lines: each key's record in the primary (and the replica where it
/// differs), the callers, and the effects so far.
pub fn summary(s: &State) -> String {
    let mut out = String::new();
    let rel = |t: idem_core::Timestamp| {
        if t.as_millis() == u64::MAX {
            "never".to_string()
        } else {
            format!("{:+}", t.as_millis() as i64 - NOW.as_millis() as i64)
        }
    };
    for (k, stored) in s.primary.iter().enumerate() {
        let line = match stored {
            None => "none".to_string(),
            Some(st) => {
                let r = &st.record;
                let writer = r.outcome.as_ref().map(|o| Rules::outcome_origin(o).1);
                format!(
                    "{} token {}/{:x} lease {} expires {} outcome-by {:?} checkpoints {}",
                    r.state,
                    r.token.seq,
                    r.token.id,
                    rel(r.lease_until),
                    rel(r.expires_at),
                    writer.map(|w| format!("{w:x}")),
                    st.record.checkpoints.len()
                )
            }
        };
        let lagging = if s.primary[k] != s.replica[k] {
            " (replica behind)"
        } else {
            ""
        };
        let _ = writeln!(out, "       k{k}: {line}{lagging}");
    }
    for (i, c) in s.callers.iter().enumerate() {
        let phase = match &c.phase {
            Phase::Idle => "idle".to_string(),
            Phase::Waiting { until, .. } => format!("waiting until {}", rel(*until)),
            Phase::Holding(h) => format!(
                "holds {}/{:x}, next effect {}, lease {}",
                h.token.seq,
                h.token.id,
                h.next,
                rel(h.lease_until)
            ),
        };
        let _ = writeln!(
            out,
            "       caller {i}: {phase}, calls left {}",
            c.calls_left
        );
    }
    if let Some(h) = s.recon.holding {
        let _ = writeln!(
            out,
            "       reconciler holds k{} {}/{:x}",
            h.key, h.token.seq, h.token.id
        );
    }
    let _ = writeln!(
        out,
        "       effects (key, generation, step, times): {:?}",
        s.ghost.effects
    );
    out
}
