//! The model's state: the callers, the reconciler, the store (primary and replica) and the ghost
//! variables the properties read (what happened downstream, what was answered).

use std::hash::{Hash, Hasher};

use idem_core::{Record, RecordState, Timestamp, Token};

/// "Now", always: the clock is relative. A tick moves every stored instant one tick into the
/// past instead of moving now forward (the store's `Rules::tick`).
pub const NOW: Timestamp = Timestamp::from_millis(1_000_000);

/// One state of the whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The callers, in the order of [`crate::Config::callers`].
    pub callers: Vec<Caller>,
    /// The reconciler.
    pub recon: Recon,
    /// What the store serves, per key.
    pub primary: Vec<Option<Stored>>,
    /// What a failover would promote, per key: the primary as it was when it last replicated
    /// (with acknowledged writes, always the primary).
    pub replica: Vec<Option<Stored>>,
    /// Crashes still allowed.
    pub crashes_left: u8,
    /// Failovers still allowed.
    pub failovers_left: u8,
    /// What happened, for the properties.
    pub ghost: Ghost,
}

/// A caller running the executor's steps.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Calls it may still make.
    pub calls_left: u8,
    /// Claims it has won (its next token id derives from it).
    pub claims: u8,
    /// Where it is.
    pub phase: Phase,
}

/// Where a caller is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Between calls (or done, when no call is left).
    Idle,
    /// A repeat waiting for the operation in flight to change ([contract
    /// §5.2](idem_core::contract#waiting)): it holds no lease and writes nothing.
    Waiting {
        /// The record it saw.
        seen: Seen,
        /// When it stops waiting.
        until: Timestamp,
    },
    /// Holding a claim.
    Holding(Hold),
}

/// A claim a caller holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hold {
    /// Its token.
    pub token: Token,
    /// The operation's generation it belongs to (see [`Ghost::generation`]).
    pub generation: u8,
    /// The next effect to run (it starts after the checkpoints it found).
    pub next: u8,
    /// Whether this attempt has run an effect.
    pub ran: bool,
    /// Whether a checkpoint is due before the next effect.
    pub checkpoint_due: bool,
    /// The lease as this holder knows it (from its claim or its last extend).
    pub lease_until: Timestamp,
}

/// The reconciler: takes stale claims over and asks the probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Recon {
    /// Takeovers it may still make.
    pub passes_left: u8,
    /// Claims it has won.
    pub claims: u8,
    /// The stale record it read back and is about to take over (the real reconciler's `get`,
    /// then `claim`: two store calls, anything may happen between them).
    pub checked: Option<Checked>,
    /// The record it holds, if any.
    pub holding: Option<ReconHold>,
}

/// A stale record the reconciler read back, to take over next. Compared by its key, its request,
/// its expiry and when it was read: all the takeover reads of it.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The key.
    pub key: u8,
    /// The record's request.
    pub request: u8,
    /// The record as it was read (ticks move its instants, like the store's).
    pub record: Record,
    /// When it was read (ticks move it too).
    pub read_at: Timestamp,
}

impl Checked {
    fn cmp_key(&self) -> impl PartialEq + Hash + '_ {
        (self.key, self.request, self.record.expires_at, self.read_at)
    }
}

impl PartialEq for Checked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_key() == other.cmp_key()
    }
}

impl Eq for Checked {}

impl Hash for Checked {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.cmp_key().hash(state);
    }
}

/// The record a waiting request saw ([contract §5.2](idem_core::contract#waiting)), compared, as
/// `idem_core::wait::changed` compares it, by state, token, lease and last write only.
#[derive(Debug, Clone)]
pub struct Seen(pub Record);

impl Seen {
    fn cmp_key(&self) -> impl PartialEq + Hash + '_ {
        let r = &self.0;
        (r.state, r.token, r.lease_until, r.updated_at)
    }
}

impl PartialEq for Seen {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_key() == other.cmp_key()
    }
}

impl Eq for Seen {}

impl Hash for Seen {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.cmp_key().hash(state);
    }
}

/// A record the reconciler took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReconHold {
    /// The key.
    pub key: u8,
    /// The record's request.
    pub request: u8,
    /// The reconciler's token.
    pub token: Token,
    /// The operation's generation.
    pub generation: u8,
}

/// A stored record, with its checkpoints (each named by its step, its value the token id of the
/// claim that saved it).
///
/// Equality and hashing keep only what a rule can read, so that states which behave the same are
/// one state: never `created_at` and `updated_at` (nor a checkpoint's `saved_at`); the lease only
/// of a live `processing` record; of an expired record only its token's `seq` (a claim replacing
/// it continues from there).
#[derive(Debug, Clone)]
pub struct Stored {
    /// The record, as `idem_core::machine` wrote it.
    pub record: Record,
}

impl Stored {
    fn cmp_key(&self) -> impl PartialEq + Hash + '_ {
        let r = &self.record;
        let live = !r.is_expired(NOW);
        let lease = (live && r.state == RecordState::Processing).then_some(r.lease_until);
        let detail = live.then(|| {
            let outcome = r
                .outcome
                .as_ref()
                .map(|o| (o.status(), o.body(), o.class()));
            (
                r.fingerprint.as_str(),
                r.state,
                r.token.id,
                r.attempt,
                r.expires_at,
                outcome,
                r.checkpoints
                    .iter()
                    .map(|c| (c.name(), c.value()))
                    .collect::<Vec<_>>(),
            )
        });
        (r.token.seq, lease, detail)
    }
}

impl PartialEq for Stored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_key() == other.cmp_key()
    }
}

impl Eq for Stored {}

impl Hash for Stored {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.cmp_key().hash(state);
    }
}

/// What happened, kept for the properties (no actor reads it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per key, the logical operation's generation: it moves on when a claim finds the last
    /// acknowledged record expired (or none), the only way the contract lets a key run again.
    pub generation: Vec<u8>,
    /// Per key, when the last acknowledged write expires (what the store would hold had it lost
    /// nothing).
    pub acknowledged_expiry: Vec<Option<Timestamp>>,
    /// Effects downstream: (key, generation, step, how many times).
    pub effects: Vec<(u8, u8, u8, u8)>,
    /// The first completion of each operation: (key, generation, token id of its writer).
    pub first_completion: Vec<(u8, u8, u128)>,
    /// Per key, whether a claim is open: written and not yet settled by `complete` or `release`.
    pub open: Vec<bool>,
    /// A write was accepted from a caller that did not hold the record's token.
    pub unfenced_write: bool,
    /// A caller was replayed an outcome.
    pub replayed: bool,
    /// The reconciler's takeover claim found no live record and created one.
    pub recreated: bool,
    /// A caller was replayed an outcome of another request.
    pub foreign_replay: bool,
    /// A caller was replayed an outcome that is not the operation's first completion.
    pub replay_differs: bool,
}

impl Ghost {
    /// How many times `step` of (key, generation) ran downstream.
    pub fn effect_count(&self, key: u8, generation: u8, step: u8) -> u8 {
        self.effects
            .iter()
            .find(|e| (e.0, e.1, e.2) == (key, generation, step))
            .map_or(0, |e| e.3)
    }

    /// Counts one more run of `step`.
    pub fn add_effect(&mut self, key: u8, generation: u8, step: u8) {
        match self
            .effects
            .iter_mut()
            .find(|e| (e.0, e.1, e.2) == (key, generation, step))
        {
            Some(e) => e.3 = e.3.saturating_add(1),
            None => {
                self.effects.push((key, generation, step, 1));
                self.effects.sort_unstable();
            }
        }
    }

    /// The token id of the first completion of (key, generation).
    pub fn first(&self, key: u8, generation: u8) -> Option<u128> {
        self.first_completion
            .iter()
            .find(|f| (f.0, f.1) == (key, generation))
            .map(|f| f.2)
    }
}
