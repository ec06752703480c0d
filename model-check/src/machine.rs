//! The transition rules the model's store runs: [`Machine`], whose every method is
//! `idem_core::machine`'s rule of the same name unless a test overrides it.
//!
//! The checker is only worth its runs if a broken rule fails it ([contract
//! §3](idem_core::contract#model-check)). The model's tests check the rules that ship
//! ([`Shipped`]) and, to show that the search stops at a counterexample, seeded mutants of them:
//! each a [`Machine`] that overrides one method (`model-check/tests/mutants.rs`). The rules that
//! ship are not touched.

use std::fmt::Debug;
use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, CheckpointTooLarge, ClaimAnswer, ClaimRequest, CompleteAnswer,
    ExtendAnswer, OutcomeTooLarge, ReleaseAnswer, Transition, ZeroLease,
};
use idem_core::{Checkpoint, Outcome, Policy, Record, Timestamp, Token};

/// The rules of [contract §2](idem_core::contract#states) as the model's store calls them, with
/// `idem_core::machine`'s signatures. Every method defaults to `idem_core::machine`'s rule.
pub trait Machine: Debug + Send + Sync + 'static {
    /// `claim` (`idem_core::machine::claim`).
    fn claim(
        &self,
        found: Option<&Record>,
        req: ClaimRequest<'_>,
        now: Timestamp,
        policy: &Policy,
    ) -> Transition<ClaimAnswer> {
        machine::claim(found, req, now, policy)
    }

    /// `complete` (`idem_core::machine::complete`).
    fn complete(
        &self,
        found: Option<&Record>,
        token: Token,
        outcome: &Outcome,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Transition<CompleteAnswer>, OutcomeTooLarge> {
        machine::complete(found, token, outcome, now, policy)
    }

    /// `release` (`idem_core::machine::release`).
    fn release(
        &self,
        found: Option<&Record>,
        token: Token,
        now: Timestamp,
    ) -> Transition<ReleaseAnswer> {
        machine::release(found, token, now)
    }

    /// `extend` (`idem_core::machine::extend`).
    fn extend(
        &self,
        found: Option<&Record>,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Transition<ExtendAnswer>, ZeroLease> {
        machine::extend(found, token, lease, now)
    }

    /// `checkpoint` (`idem_core::machine::checkpoint`).
    fn checkpoint(
        &self,
        found: Option<&Record>,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<Transition<CheckpointAnswer>, CheckpointTooLarge> {
        machine::checkpoint(found, token, checkpoint, policy)
    }
}

/// The rules that ship: `idem_core::machine`'s, every one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shipped;

impl Machine for Shipped {}
