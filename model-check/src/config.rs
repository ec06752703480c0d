//! What one model contains: its callers, its store, its clock and its bounds.

use idem_core::StalePolicy;

/// One caller: which key it names and which request it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerSpec {
    /// The key's index (keys are `k0`, `k1`, …).
    pub key: u8,
    /// The request's index: two callers with different requests on one key reuse a key for
    /// another request.
    pub request: u8,
    /// How many calls it makes (an orchestrator's retries, a restart after a crash).
    pub calls: u8,
}

/// When the store acknowledges a write ([contract §6.1](idem_core::contract#checkpoints),
/// "Failover").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Replication {
    /// After the replica confirmed it (Redis `WAIT`, PostgreSQL synchronous standby): a failover
    /// loses nothing that was acknowledged.
    Acknowledged,
    /// Before the replica has it: a failover can lose the last acknowledged writes.
    Asynchronous,
}

/// A model: the actors, the settings under test and the bounds of the search.
///
/// Time is relative (see [`crate::model`]): there is no bound on the clock; the bounds are the
/// calls, crashes, failovers and the reconciler's takeovers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// The callers, each running the executor's steps.
    pub callers: Vec<CallerSpec>,
    /// Effects per operation (1, or 2 for "charge, then email").
    pub effects: u8,
    /// What a claim of a `processing` record whose lease elapsed does.
    pub stale: StalePolicy,
    /// How many times the reconciler may take a stale record over (0: no reconciler).
    pub reconcile_passes: u8,
    /// Whether the reconciler reads a stale record back and claims it in two store calls, with
    /// anything in between (as `idem_core::reconcile::Reconciler` does), or in one step. The
    /// two-call model has several times the states (`docs/model-check.md`).
    pub reconcile_reads_first: bool,
    /// Whether the reconciler's takeover claim keeps the record's own expiry, as
    /// `idem_core::reconcile::Reconciler` does (`takeover_policy`). Off, it is the reconciler
    /// before that rule (the callers' ttl, however old the read): kept to show what the checker
    /// finds then.
    pub reconcile_own_expiry: bool,
    /// Whether the probe may answer "unknown" although the downstream system knows (a probe that
    /// is down). Off, it answers "unknown" only when the operation is half done.
    pub probe_unknown: bool,
    /// How many crashes of holders, in all.
    pub crashes: u8,
    /// How many failovers of the store.
    pub failovers: u8,
    /// When the store acknowledges writes.
    pub replication: Replication,
    /// Whether holders never start an effect after the lease they know of ended ([contract
    /// §7](idem_core::contract#traps): heartbeat with `extend` and stop when the claim is lost).
    pub honour_lease: bool,
    /// Whether holders save a checkpoint after each effect but the last ([contract
    /// §6.1](idem_core::contract#checkpoints)).
    pub checkpoints: bool,
    /// Whether a repeat that finds the operation in flight waits for a change ([contract
    /// §5.2](idem_core::contract#waiting)).
    pub waiting: bool,
    /// Whether an attempt may fail with a retryable outcome before its first effect.
    pub retryable: bool,
    /// The lease, in ticks of the clock.
    pub lease: u64,
    /// The ttl in ticks, or `None` for records that never expire.
    pub ttl: Option<u64>,
}

impl Config {
    /// Two callers on one key, one effect, one crash, reconciliation with a probe, a store that
    /// does not fail over; a lease of 2 ticks and a ttl of 5.
    pub fn small() -> Self {
        Self {
            callers: vec![
                CallerSpec {
                    key: 0,
                    request: 0,
                    calls: 2,
                },
                CallerSpec {
                    key: 0,
                    request: 0,
                    calls: 1,
                },
            ],
            effects: 1,
            stale: StalePolicy::Reconcile,
            reconcile_passes: 2,
            reconcile_reads_first: false,
            reconcile_own_expiry: true,
            probe_unknown: true,
            crashes: 1,
            failovers: 0,
            replication: Replication::Acknowledged,
            honour_lease: true,
            checkpoints: false,
            waiting: false,
            retryable: false,
            lease: 2,
            ttl: Some(5),
        }
    }

    /// Stale claims are taken over by the next caller; no reconciler.
    pub fn takeover(mut self) -> Self {
        self.stale = StalePolicy::Takeover;
        self.reconcile_passes = 0;
        self
    }

    /// The number of keys the callers name.
    pub fn keys(&self) -> usize {
        self.callers
            .iter()
            .map(|c| usize::from(c.key) + 1)
            .max()
            .unwrap_or(0)
    }

    /// The number of distinct requests the callers send.
    pub fn requests(&self) -> usize {
        self.callers
            .iter()
            .map(|c| usize::from(c.request) + 1)
            .max()
            .unwrap_or(0)
    }
}
