//! Liveness beyond what stateright checks: "from every reachable state, a settled state can be
//! reached" (CTL `AG EF settled`).
//!
//! Stateright's `eventually` properties are checked only on paths that end (its docs: a path
//! that closes a cycle is not seen as ending), and they ask that *every* path settles, which no
//! protocol with retries promises (a caller may keep waiting while time stands still). What the
//! SPEC promises is that settling stays *possible* whatever happened so far: no state is a trap.
//! This module builds the whole reachable graph with the model's own transitions, marks the
//! states from which a settled state is reachable (a backward search from the settled ones), and
//! reports the first state, in breadth-first order, that cannot settle.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use stateright::Model;

use crate::action::Action;
use crate::config::Config;
use crate::model::ProtocolModel;
use crate::properties;
use crate::state::State;

/// What a liveness check found.
#[derive(Debug)]
pub struct Liveness {
    /// Distinct states explored.
    pub states: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// A path from the start to a state from which no settled state can be reached, if any.
    pub trap: Option<Vec<Action>>,
}

fn fingerprint(s: &State) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Checks that from every reachable state of `cfg`'s model, a state where no claim is open
/// ([`properties::settled`]) can be reached.
pub fn always_can_settle(cfg: Config) -> Liveness {
    let started = Instant::now();
    let model = ProtocolModel::new(cfg);
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut parent: Vec<Option<(u32, Action)>> = Vec::new();
    let mut predecessors: Vec<Vec<u32>> = Vec::new();
    let mut goal: Vec<bool> = Vec::new();
    let mut queue = VecDeque::new();
    for s in model.init_states() {
        if let Entry::Vacant(v) = ids.entry(fingerprint(&s)) {
            v.insert(u32::try_from(parent.len()).expect("under 4 G states"));
            parent.push(None);
            predecessors.push(Vec::new());
            goal.push(properties::settled(&s));
            queue.push_back((s, parent.len() - 1));
        }
    }
    while let Some((s, id)) = queue.pop_front() {
        let id = u32::try_from(id).expect("under 4 G states");
        for (action, next) in model.next_steps(&s) {
            let next_id = match ids.entry(fingerprint(&next)) {
                Entry::Occupied(o) => *o.get(),
                Entry::Vacant(v) => {
                    let next_id = u32::try_from(parent.len()).expect("under 4 G states");
                    v.insert(next_id);
                    parent.push(Some((id, action)));
                    predecessors.push(Vec::new());
                    goal.push(properties::settled(&next));
                    queue.push_back((next, parent.len() - 1));
                    next_id
                }
            };
            predecessors[next_id as usize].push(id);
        }
    }
    let mut can_settle = goal.clone();
    let mut stack: Vec<u32> = (0..goal.len())
        .filter(|&i| goal[i])
        .map(|i| i as u32)
        .collect();
    while let Some(x) = stack.pop() {
        for &p in &predecessors[x as usize] {
            if !can_settle[p as usize] {
                can_settle[p as usize] = true;
                stack.push(p);
            }
        }
    }
    let trap = can_settle.iter().position(|ok| !ok).map(|mut at| {
        let mut actions = Vec::new();
        while let Some((from, action)) = parent[at] {
            actions.push(action);
            at = from as usize;
        }
        actions.reverse();
        actions
    });
    Liveness {
        states: goal.len(),
        elapsed: started.elapsed(),
        trap,
    }
}
