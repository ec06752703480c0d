//! Seeded mutants of `idem_core::machine`'s rules: each must fail the model check, as CI runs it
//! (`run::check`), with a counterexample reached in a small part of the space
//! ([contract §3](idem_core::contract#model-check): a checker that cannot fail in practice proves
//! nothing). Each mutant is one [`Machine`] that breaks one rule the way a one-line change to
//! `idem_core::machine` would; the rules that ship are not touched. Figures in
//! `docs/model-check.md` ("Seeded mutants").

use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, CheckpointTooLarge, ClaimAnswer, ClaimRequest, CompleteAnswer,
    ExtendAnswer, OutcomeTooLarge, ReleaseAnswer, Transition, ZeroLease,
};
use idem_core::{Checkpoint, Outcome, Policy, Record, RecordState, Timestamp, Token};
use idem_model_check::machine::Machine;
use idem_model_check::properties::{AT_MOST_ONCE, CHECKPOINTS_END, FENCING, NO_FOREIGN_REPLAY};
use idem_model_check::run::check;
use idem_model_check::{CallerSpec, Config, ProtocolModel};

/// `held` without the token comparison: `complete`, `release`, `extend` and `checkpoint` act on a
/// live `processing` record for any caller (as if it held the record's token).
#[derive(Debug)]
struct HeldIgnoresToken;

/// The token `held` would accept for `found` without its token comparison.
fn any_holder(found: Option<&Record>, token: Token, now: Timestamp) -> Token {
    found
        .filter(|r| !r.is_expired(now) && r.state == RecordState::Processing)
        .map_or(token, |r| r.token)
}

impl Machine for HeldIgnoresToken {
    fn complete(
        &self,
        found: Option<&Record>,
        token: Token,
        outcome: &Outcome,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Transition<CompleteAnswer>, OutcomeTooLarge> {
        machine::complete(found, any_holder(found, token, now), outcome, now, policy)
    }

    fn release(
        &self,
        found: Option<&Record>,
        token: Token,
        now: Timestamp,
    ) -> Transition<ReleaseAnswer> {
        machine::release(found, any_holder(found, token, now), now)
    }

    fn extend(
        &self,
        found: Option<&Record>,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Transition<ExtendAnswer>, ZeroLease> {
        machine::extend(found, any_holder(found, token, now), lease, now)
    }

    fn checkpoint(
        &self,
        found: Option<&Record>,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<Transition<CheckpointAnswer>, CheckpointTooLarge> {
        let token = any_holder(found, token, checkpoint.saved_at());
        machine::checkpoint(found, token, checkpoint, policy)
    }
}

/// `claim` without its "lease still running" row: a `processing` record is treated as stale
/// whatever its lease, so a claim under `StalePolicy::Takeover` (the reconciler's) takes over a
/// holder whose lease runs.
#[derive(Debug)]
struct ClaimIgnoresRunningLease;

impl Machine for ClaimIgnoresRunningLease {
    fn claim(
        &self,
        found: Option<&Record>,
        req: ClaimRequest<'_>,
        now: Timestamp,
        policy: &Policy,
    ) -> Transition<ClaimAnswer> {
        let elapsed = found.map(|r| Record {
            lease_until: r.lease_until.min(now),
            ..r.clone()
        });
        machine::claim(elapsed.as_ref(), req, now, policy)
    }
}

/// `extend` sets the lease to `now + lease`, without "the later deadline wins": a heartbeat that
/// asks for less than is left shortens the lease.
#[derive(Debug)]
struct ExtendShortens;

impl Machine for ExtendShortens {
    fn extend(
        &self,
        found: Option<&Record>,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Transition<ExtendAnswer>, ZeroLease> {
        let mut t = machine::extend(found, token, lease, now)?;
        if let Some(write) = &mut t.write {
            write.lease_until = now + lease;
            t.answer = ExtendAnswer::Extended {
                lease_until: write.lease_until,
            };
        }
        Ok(t)
    }
}

/// `complete` keeps the record's checkpoints when it completes it.
#[derive(Debug)]
struct CompletionKeepsCheckpoints;

impl Machine for CompletionKeepsCheckpoints {
    fn complete(
        &self,
        found: Option<&Record>,
        token: Token,
        outcome: &Outcome,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Transition<CompleteAnswer>, OutcomeTooLarge> {
        let mut t = machine::complete(found, token, outcome, now, policy)?;
        if let (Some(write), Some(found)) = (&mut t.write, found) {
            write.checkpoints = found.checkpoints.clone();
        }
        Ok(t)
    }
}

/// `claim` compares the fingerprint only of a record that is not `completed`: another request
/// on a completed key is replayed its outcome.
#[derive(Debug)]
struct ReplayIgnoresFingerprint;

impl Machine for ReplayIgnoresFingerprint {
    fn claim(
        &self,
        found: Option<&Record>,
        req: ClaimRequest<'_>,
        now: Timestamp,
        policy: &Policy,
    ) -> Transition<ClaimAnswer> {
        let completed = found.filter(|r| !r.is_expired(now) && r.state == RecordState::Completed);
        match completed.and_then(|r| r.outcome.clone()) {
            Some(outcome) => Transition {
                answer: ClaimAnswer::Replay(outcome),
                write: None,
            },
            None => machine::claim(found, req, now, policy),
        }
    }
}

/// Two callers on one key, one call each, one crash, a reconciler with a probe (two passes): the
/// base model of `tests/model_check.rs`.
fn base() -> Config {
    let mut cfg = Config::small();
    cfg.callers[0].calls = 1;
    cfg
}

/// The most states a search may visit before its counterexample. Searched to the end, these
/// models have 8,645 to 226,775 states under the rules that ship and 25,063 to 230,841 under
/// their mutant (the shortening extend's has no end): a search that visits fewer stopped at its
/// counterexample.
const FEW_STATES: usize = 20_000;

/// The model check of `cfg` under `mutant`, as CI runs it, fails: a safety property in
/// `expected` has a counterexample, found within [`FEW_STATES`]. Returns its trace.
fn killed(name: &str, cfg: Config, mutant: impl Machine, expected: &[&'static str]) -> String {
    let r = check(ProtocolModel::with_machine(cfg, mutant));
    println!(
        "{name}: {} states ({} generated), depth {}, {:.2?}; fails: {:?}",
        r.unique_states,
        r.states,
        r.max_depth,
        r.elapsed,
        r.violations.keys()
    );
    let property = expected
        .iter()
        .find(|p| r.violations.contains_key(*p))
        .unwrap_or_else(|| panic!("{name}: the mutant survives: none of {expected:?} fails"));
    let trace = r.trace(property).expect("a trace");
    println!("{name}: counterexample to {property}:\n{trace}");
    assert!(
        r.unique_states < FEW_STATES,
        "{name}: {} states searched: the search did not stop at its counterexample",
        r.unique_states
    );
    trace
}

#[test]
fn mutant_held_without_the_token_comparison_is_killed() {
    let trace = killed(
        "held ignores the token",
        base(),
        HeldIgnoresToken,
        &[AT_MOST_ONCE, FENCING],
    );
    // A caller whose claim was taken over writes anyway.
    assert!(trace.contains("ReconcileCheck"), "{trace}");
}

#[test]
fn mutant_claim_that_takes_over_a_running_lease_is_killed() {
    // The reconciler reads a stale record, the holder renews its lease, the reconciler's claim
    // takes it over anyway: the read and the claim are two steps, as in the code.
    let mut cfg = base();
    cfg.reconcile_reads_first = true;
    let trace = killed(
        "claim takes over a running lease",
        cfg,
        ClaimIgnoresRunningLease,
        &[AT_MOST_ONCE],
    );
    assert!(trace.contains("Extend("), "{trace}");
}

#[test]
fn mutant_extend_that_shortens_the_lease_is_killed() {
    let trace = killed(
        "extend shortens the lease",
        base(),
        ExtendShortens,
        &[AT_MOST_ONCE],
    );
    assert!(trace.contains("ExtendShort("), "{trace}");
}

#[test]
fn mutant_completion_that_keeps_checkpoints_is_killed() {
    let mut cfg = base();
    cfg.effects = 2;
    cfg.checkpoints = true;
    killed(
        "completion keeps checkpoints",
        cfg,
        CompletionKeepsCheckpoints,
        &[CHECKPOINTS_END],
    );
}

#[test]
fn mutant_replay_of_another_request_is_killed() {
    let mut cfg = base();
    cfg.callers.push(CallerSpec {
        key: 0,
        request: 1,
        calls: 1,
    });
    cfg.reconcile_passes = 1;
    killed(
        "replay ignores the fingerprint",
        cfg,
        ReplayIgnoresFingerprint,
        &[NO_FOREIGN_REPLAY],
    );
}
