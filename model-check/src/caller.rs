//! A caller running the executor's steps: claim; then effects (with a checkpoint after each but the
//! last), heartbeats, and `complete`; or `release` before any effect; or a crash anywhere. A repeat
//! that finds the operation in flight may wait for a change ([contract
//! §5.2](idem_core::contract#waiting)).

use std::time::Duration;

use idem_core::machine::{ClaimAnswer, ExtendAnswer};

use crate::action::Action;
use crate::spec_rules;
use crate::state::{Hold, Phase, Seen, State};
use crate::store::{NOW, Rules};

/// The lease of a heartbeat that asks for less than the holder has left (one tick): `extend`
/// never shortens a lease, so it changes nothing, unless the rule is broken.
const SHORT_LEASE: Duration = Duration::from_millis(1);

/// The steps caller `i` can take in `s`.
pub fn actions(rules: &Rules, s: &State, i: u8, out: &mut Vec<Action>) {
    let cfg = &rules.cfg;
    let c = &s.callers[usize::from(i)];
    let key = cfg.callers[usize::from(i)].key;
    match &c.phase {
        Phase::Idle if c.calls_left > 0 => out.push(Action::Call(i)),
        Phase::Idle => {}
        Phase::Waiting { seen, until } => {
            if spec_rules::wakes(&seen.0, Rules::found(s, key), *until, NOW) {
                out.push(Action::Wake(i));
            }
        }
        Phase::Holding(h) => {
            if h.checkpoint_due {
                out.push(Action::Checkpoint(i));
            } else if h.next < cfg.effects {
                if !cfg.honour_lease || NOW < h.lease_until {
                    out.push(Action::Effect(i));
                }
            } else {
                out.push(Action::Complete(i));
            }
            let lease = rules.policy.lease();
            if NOW + lease > h.lease_until {
                out.push(Action::Extend(i));
            }
            if NOW + SHORT_LEASE < h.lease_until {
                out.push(Action::ExtendShort(i));
            }
            if !h.ran {
                out.push(Action::Release(i));
                if cfg.retryable {
                    out.push(Action::FailRetryable(i));
                }
            }
            if s.crashes_left > 0 {
                out.push(Action::Crash(i));
            }
        }
    }
}

/// Takes step `action` of caller `i`.
pub fn step(rules: &Rules, s: &mut State, i: u8, action: Action) {
    let spec = rules.cfg.callers[usize::from(i)];
    let (key, request) = (spec.key, spec.request);
    let ci = usize::from(i);
    match action {
        Action::Call(_) => {
            s.callers[ci].calls_left -= 1;
            claim(rules, s, i, true);
        }
        Action::Wake(_) => claim(rules, s, i, false),
        Action::Crash(_) => {
            s.crashes_left -= 1;
            s.callers[ci].phase = Phase::Idle;
        }
        _ => {
            let Phase::Holding(mut h) = s.callers[ci].phase.clone() else {
                unreachable!("only a holder takes {action:?}")
            };
            let keep = match action {
                Action::Effect(_) => {
                    s.ghost.add_effect(key, h.generation, h.next);
                    h.next += 1;
                    h.ran = true;
                    h.checkpoint_due = rules.cfg.checkpoints && h.next < rules.cfg.effects;
                    true
                }
                Action::Checkpoint(_) => {
                    h.checkpoint_due = false;
                    rules.checkpoint(s, key, h.token)
                }
                Action::Extend(_) | Action::ExtendShort(_) => {
                    let lease = match action {
                        Action::Extend(_) => rules.policy.lease(),
                        _ => SHORT_LEASE,
                    };
                    match rules.extend(s, key, h.token, lease) {
                        // What `Attempt::extend` tells the operation: the claim is still held,
                        // and (the later deadline wins) its lease runs at least `lease` more.
                        ExtendAnswer::Extended { .. } => {
                            h.lease_until = h.lease_until.max(NOW + lease);
                            true
                        }
                        ExtendAnswer::Fenced => false,
                    }
                }
                Action::Complete(_) | Action::FailRetryable(_) => {
                    let definitive = matches!(action, Action::Complete(_));
                    let outcome = Rules::outcome(request, h.token, definitive);
                    rules.complete(s, key, h.token, &outcome);
                    false
                }
                Action::Release(_) => {
                    rules.release(s, key, h.token);
                    false
                }
                _ => unreachable!("not a caller's step: {action:?}"),
            };
            // A holder that lost its claim (fenced) or settled it is done with this call.
            s.callers[ci].phase = if keep { Phase::Holding(h) } else { Phase::Idle };
        }
    }
}

/// Claims, and acts on the answer: hold, take the replay, wait, or give the answer back.
fn claim(rules: &Rules, s: &mut State, i: u8, may_wait: bool) {
    let ci = usize::from(i);
    let spec = rules.cfg.callers[ci];
    let (key, request) = (spec.key, spec.request);
    let token_id = (u128::from(i) + 1) << 8 | u128::from(s.callers[ci].claims);
    let (answer, generation) = rules.claim(s, key, request, token_id, &rules.policy);
    let phase = match answer {
        ClaimAnswer::Claimed { token, .. } => {
            s.callers[ci].claims += 1;
            let stored = s.primary[usize::from(key)]
                .as_ref()
                .expect("the claim's record");
            Phase::Holding(Hold {
                token,
                generation,
                next: u8::try_from(stored.record.checkpoints.len()).expect("few checkpoints"),
                ran: false,
                checkpoint_due: false,
                lease_until: stored.record.lease_until,
            })
        }
        ClaimAnswer::Replay(outcome) => {
            let (origin, writer) = Rules::outcome_origin(&outcome);
            s.ghost.replayed = true;
            if origin != request {
                s.ghost.foreign_replay = true;
            }
            if s.ghost.first(key, generation) != Some(writer) {
                s.ghost.replay_differs = true;
            }
            Phase::Idle
        }
        ClaimAnswer::InFlight { stale: false, .. } if may_wait && rules.cfg.waiting => {
            let record = Rules::found(s, key).expect("an in-flight record");
            let max_wait = Duration::from_millis(rules.cfg.lease);
            Phase::Waiting {
                seen: Seen(record.clone()),
                until: spec_rules::wait_until(record, NOW, max_wait),
            }
        }
        ClaimAnswer::InFlight { .. } | ClaimAnswer::FingerprintMismatch => Phase::Idle,
    };
    s.callers[ci].phase = phase;
}
