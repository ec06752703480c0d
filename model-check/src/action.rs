//! The steps the model can take.

/// What the probe answers ([contract §6](idem_core::contract#beyond-one-call): "did this happen?").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Finding {
    /// The step it was asked about happened downstream.
    Found,
    /// It did not.
    NotFound,
    /// The probe cannot tell.
    Unknown,
}

/// One step of one actor, or of the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Caller `i` calls: it claims (executor: `claim`).
    Call(u8),
    /// Waiting caller `i` re-reads and claims like any retry ([contract
    /// §5.2](idem_core::contract#waiting)).
    Wake(u8),
    /// Holder `i` runs its next effect downstream.
    Effect(u8),
    /// Holder `i` saves a checkpoint after an effect ([contract
    /// §6.1](idem_core::contract#checkpoints)).
    Checkpoint(u8),
    /// Holder `i` renews its lease (a heartbeat).
    Extend(u8),
    /// Holder `i` renews its lease for less than it has left (`Attempt::extend` takes any
    /// lease): the later deadline stays, and the holder counts on it.
    ExtendShort(u8),
    /// Holder `i` records its definitive outcome (executor: `complete`).
    Complete(u8),
    /// Holder `i`'s operation fails with a retryable outcome before any effect.
    FailRetryable(u8),
    /// Holder `i` gives the claim back before any effect (its caller went away).
    Release(u8),
    /// Holder `i` crashes; it may call again (a restart) if it has calls left.
    Crash(u8),
    /// The reconciler lists a key's stale claim and reads it back: still stale.
    ReconcileCheck(u8),
    /// The reconciler claims the record it checked, under the takeover policy.
    ReconcileTake,
    /// The reconciler's probe answers, and it acts: complete, release, checkpoint, or leave.
    ReconcileSettle(Finding),
    /// The clock moves one tick.
    Tick,
    /// `purge_expired` deletes a key's expired record.
    Purge(u8),
    /// The replica catches up with the primary.
    Replicate,
    /// The primary fails; the replica is promoted.
    Failover,
}
