//! The model-based test ([contract §3.9](idem_core::contract#guarantee-9)): random sequences of
//! every operation and clock moves, run against the pure rules of [`idem_core::machine`] over a
//! map (the model) and against the store under test. [`run_model`] says what it does.

use std::fmt;
use std::time::Duration;

use idem_core::Timestamp;

use crate::harness::StoreFactory;

mod ops;
mod runner;
mod world;

pub use runner::check_model;

/// The environment variable that sets how many sequences [`run_model`] runs.
const CASES_ENV: &str = "IDEM_CONFORMANCE_MODEL_CASES";
/// How many sequences [`run_model`] runs when [`CASES_ENV`] is not set.
const DEFAULT_CASES: u32 = 256;
/// The longest sequence, in steps, by default.
const DEFAULT_MAX_STEPS: usize = 24;
/// Progress goes to stderr every this many sequences (long runs can be followed).
const PROGRESS_EVERY: u64 = 5_000;
/// How long one sequence may take before it fails (a deadlocked store must not hang CI).
const SEQUENCE_TIMEOUT: Duration = Duration::from_secs(60);

const SCOPES: [&str; 3] = ["a", "A", "a:b"];
const KEYS: [&str; 3] = ["k", "K", "b:k"];
const LEASES: [Duration; 2] = [Duration::from_secs(5), Duration::from_secs(30)];
const TTLS: [Duration; 2] = [Duration::from_secs(60), Duration::from_secs(300)];
const EXTENDS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(100),
];
/// The size limit of the policy an over-the-limit `complete` runs under.
const SMALL_LIMIT: usize = 8;
/// A token id no claim hands out (the model's ids are even, and the store's are random).
const NEVER_ID: u128 = u128::MAX;
/// The first instant of the first sequence: 2001-01-01.
const EPOCH: Timestamp = Timestamp::from_millis(978_307_200_000);

/// How many sequences to run, and how long they may be: 256 sequences of up to 24 steps by
/// default.
///
/// ```
/// let mut config = idem_conformance::ModelConfig::default();
/// config.cases = 2_000;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelConfig {
    /// How many sequences (proptest cases) to run.
    pub cases: u32,
    /// The longest sequence, in steps.
    pub max_steps: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            cases: DEFAULT_CASES,
            max_steps: DEFAULT_MAX_STEPS,
        }
    }
}

impl ModelConfig {
    /// The default, with the case count from the environment variable
    /// `IDEM_CONFORMANCE_MODEL_CASES` if it is set.
    ///
    /// # Panics
    ///
    /// If the variable is set to anything but a positive integer (a typo must not silently run
    /// the default).
    pub fn from_env() -> Self {
        let mut config = Self::default();
        if let Ok(value) = std::env::var(CASES_ENV) {
            config.cases = match value.trim().parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => panic!("{CASES_ENV}={value:?}: expected a positive number of sequences"),
            };
        }
        config
    }
}

/// What a passing run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelStats {
    /// Sequences run (proptest cases).
    pub cases: u32,
    /// Steps run in all, not counting the reads and purges that check each sequence.
    pub steps: u64,
}

/// A failing run: the minimal failing sequence shrinking found, and why it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelFailure {
    /// The sequence, one numbered line per step.
    pub sequence: String,
    /// What differed between the store and the model, and at which step.
    pub message: String,
}

impl fmt::Display for ModelFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the store disagrees with the model (idem_core::machine).\nminimal failing sequence:\n{}\n{}",
            self.sequence, self.message
        )
    }
}

impl std::error::Error for ModelFailure {}

/// Runs the model-based test ([contract §3.9](idem_core::contract#guarantee-9)) with
/// [`ModelConfig::from_env`]: random sequences of every operation and clock moves, run against the
/// pure rules of [`idem_core::machine`] over a map (the model) and against the store under test,
/// comparing every answer and every record.
///
/// ```no_run
/// # use idem_core::MemoryStore;
/// // Each call of the factory must return a handle to a NEW, EMPTY, PRIVATE namespace (a fresh
/// // file, a table or key prefix of its own): purge counts and lists are compared exactly, so
/// // nothing else may write there while the model runs.
/// idem_conformance::run_model(|| async { MemoryStore::new() });
/// ```
///
/// It panics on failure with the minimal failing sequence that shrinking found, one numbered line
/// per step, and what differed at its last step. It runs 256 sequences, or as many as the
/// environment variable `IDEM_CONFORMANCE_MODEL_CASES` asks for (`=100000` for a long run;
/// progress goes to stderr every 5 000 sequences); [`check_model`] returns the result instead of
/// panicking. A sequence that takes more than 60 s fails (a deadlocked store must not hang CI).
///
/// # What it does
///
/// - A sequence is up to [`ModelConfig::max_steps`] steps over 9 records: 3 scopes × 3 keys whose
///   names differ only in case or in where a `:` falls (`("…/a", "b:k")` and `("…/a:b", "k")`), so
///   a store that folds case or concatenates scope and key fails. Steps: `claim` (two possible
///   requests per key, each claim with its own policy: lease 5 s or 30 s, ttl 60 s or 300 s,
///   `Reconcile` or `Takeover`), `complete` (definitive, retryable under either cache policy, or
///   over the size limit), `release`, `extend` (1 s, 10 s or 100 s), `get`, `list` (random
///   filters and limits), `list_in_flight`, `purge_expired` (in batches) and clock moves chosen
///   to land on lease and expiry boundaries.
/// - Races: `n` identical claims at once (the store's answers must be the model's for the same
///   claims one after another, in any order: one winner at most), and a holder's `complete`,
///   `release` or `extend` at the same time as `n` claims (the store's answers and record must be
///   those of one serial order, the act after `k` of the claims for some `k`).
/// - `complete`, `release` and `extend` act with the address's latest token, an older one, the
///   latest one with a different random id, or a token never handed out.
/// - The model is a map of [`Record`](idem_core::Record)s written only by the functions of
///   [`idem_core::machine`]; [`ListFilter`](idem_core::store::ListFilter) and
///   [`Record::is_stale_processing`](idem_core::Record::is_stale_processing) select what the lists
///   must return. The model never restates a rule.
/// - Tokens: the store draws its own random token ids, the model its own. The first time the
///   store hands out a token (a `Claimed` answer) it must have the model's `seq` and be new; from
///   then on it stands for the model's token, in answers and in records. A record carrying a
///   token the store never handed out is a failure.
/// - Every answer is compared, including `retry_after`, `attempt`, `kind`, the stored outcome
///   byte for byte, lease deadlines and the exact purge counts. After each write the record at
///   that address is read back and compared; at the end of the sequence all nine are.
///   `list_in_flight` must return the model's records, earliest lease first (the order of records
///   with equal leases is free).
/// - A purge step purges in batches until a batch comes back short, each batch's count exactly
///   `min(expired left, limit)`, so the model knows which records are gone.
/// - Each sequence ends by moving the clock to the last expiry of its records and purging them
///   all, checking the counts, so the next sequence starts on an empty namespace. Time only moves
///   forward: each sequence starts well past the previous one's end. Every sequence (including
///   the re-runs of shrinking) uses scopes of its own, and after a failed sequence (the namespace
///   may then be left dirty) the factory is called again for a fresh namespace.
pub fn run_model(fresh_namespace: impl StoreFactory) -> ModelStats {
    match check_model(fresh_namespace, &ModelConfig::from_env()) {
        Ok(stats) => stats,
        Err(failure) => panic!("{failure}"),
    }
}
