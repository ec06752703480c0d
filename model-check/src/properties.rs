//! The properties, each named after the SPEC guarantee it checks.

use std::time::Duration;

use idem_core::RecordState;

use crate::config::Config;
use crate::state::State;
use crate::store::{NOW, Rules};

/// [contract §2](idem_core::contract#states) (opening) and §3.1: no interleaving runs an operation
/// twice. Every step of every operation ran at most once downstream, except in the windows
/// [contract §7](idem_core::contract#traps) documents.
pub const AT_MOST_ONCE: &str = "at most one effect per operation (contract §2, §3.1)";
/// contract [§3.3](idem_core::contract#guarantee-3) and [§3.10](idem_core::contract#guarantee-10):
/// a live completed record's outcome, and every checkpoint, was written by the holder of the token
/// the record had then.
pub const FENCING: &str =
    "fencing: outcome and checkpoints come from the token's holder (contract §3.3, §3.10)";
/// [contract §2](idem_core::contract#states) (`FingerprintMismatch` row) and §4: a key reused for
/// another request never replays the first request's outcome.
pub const NO_FOREIGN_REPLAY: &str = "no silent replay of another request (contract §2, §4)";
/// contract [§2](idem_core::contract#states) and [§3.5](idem_core::contract#guarantee-5): every
/// replay carries the outcome of the operation's first completion.
pub const FIRST_OUTCOME: &str =
    "a replay carries the first completion's outcome (contract §2, §3.5)";
/// contract [§2](idem_core::contract#states) and [§3.6](idem_core::contract#guarantee-6): an
/// expired record is treated exactly as if it did not exist, and stays so: reconciliation (which
/// settles stale claims) never writes a record that had expired or was purged back into existence.
pub const EXPIRED_STAYS_GONE: &str =
    "reconciliation never recreates an expired record (contract §2, §3.6)";
/// contract [§3.10](idem_core::contract#guarantee-10) and [§6.1](idem_core::contract#checkpoints):
/// the checkpoints belong to the operation and its completion ends them: a completed record keeps
/// none.
pub const CHECKPOINTS_END: &str = "completion ends the checkpoints (contract §3.10, §6.1)";
/// [contract §2](idem_core::contract#states): a claim sets the lease to `now + lease` and the
/// expiry to `now + ttl`, a completion the expiry to `now + ttl`, and a heartbeat moves the expiry
/// only as far as it moves the lease: no record's deadline lies further ahead than that. (It is
/// also what keeps the model finite: a rule that pushed a deadline further on each step would
/// otherwise make the search endless instead of failing it.)
pub const DEADLINES_BOUNDED: &str =
    "no deadline lies further ahead than a lease or a ttl (contract §2)";
/// Sanity: an operation can complete (the model is not vacuous).
pub const COMPLETES: &str = "an operation completes";
/// Sanity: a repeat can be replayed.
pub const REPLAYS: &str = "a repeat is replayed";

/// [`AT_MOST_ONCE`].
pub fn at_most_once(s: &State) -> bool {
    s.ghost.effects.iter().all(|e| e.3 <= 1)
}

/// [`FENCING`].
pub fn fencing(s: &State) -> bool {
    !s.ghost.unfenced_write
        && s.primary.iter().flatten().all(|stored| {
            let r = &stored.record;
            if r.is_expired(NOW) {
                return true;
            }
            match (&r.state, &r.outcome) {
                (RecordState::Completed, Some(outcome)) => {
                    Rules::outcome_origin(outcome).1 == r.token.id
                }
                _ => true,
            }
        })
}

/// [`NO_FOREIGN_REPLAY`].
pub fn no_foreign_replay(s: &State) -> bool {
    !s.ghost.foreign_replay
}

/// [`FIRST_OUTCOME`].
pub fn first_outcome(s: &State) -> bool {
    !s.ghost.replay_differs
}

/// [`EXPIRED_STAYS_GONE`].
pub fn expired_stays_gone(s: &State) -> bool {
    !s.ghost.recreated
}

/// [`CHECKPOINTS_END`].
pub fn checkpoints_end(s: &State) -> bool {
    s.primary.iter().flatten().all(|stored| {
        let r = &stored.record;
        r.state != RecordState::Completed || r.checkpoints.is_empty()
    })
}

/// [`DEADLINES_BOUNDED`], for the lease and ttl of `cfg`.
pub fn deadlines_bounded(cfg: &Config, s: &State) -> bool {
    let lease = NOW + Duration::from_millis(cfg.lease);
    let expiry = cfg.ttl.map(|ttl| NOW + Duration::from_millis(ttl));
    s.primary.iter().chain(&s.replica).flatten().all(|stored| {
        let r = &stored.record;
        r.lease_until <= lease && expiry.is_none_or(|e| r.expires_at <= e)
    })
}

/// [`COMPLETES`].
pub fn completes(s: &State) -> bool {
    !s.ghost.first_completion.is_empty()
}

/// [`REPLAYS`].
pub fn replays(s: &State) -> bool {
    s.ghost.replayed
}

/// The goal of the liveness checks: no claim is open (every claim was settled by `complete` or
/// `release`: each key is `completed` or `failed_retryable`, or was never claimed).
pub fn settled(s: &State) -> bool {
    s.ghost.open.iter().all(|open| !open)
}
