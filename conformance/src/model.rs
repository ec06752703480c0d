//! The model-based test ([contract §3.9](idem_core::contract#guarantee-9)): random sequences of every operation and clock moves, run
//! against the pure rules of [`idem_core::machine`] over a map (the model) and against the store
//! under test, comparing every answer and every record.
//!
//! # Running it against your store
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! // Each call of the factory must return a handle to a NEW, EMPTY, PRIVATE namespace (a fresh
//! // file, a table or key prefix of its own): purge counts and lists are compared exactly, so
//! // nothing else may write there while the model runs.
//! idem_conformance::run_model(|| async { MemoryStore::new() });
//! ```
//!
//! `run_model` panics on failure with the minimal failing sequence that shrinking found, one
//! numbered line per step, and what differed at its last step. It runs
//! [`DEFAULT_CASES`] sequences, or as many as the environment variable [`CASES_ENV`]
//! (`IDEM_CONFORMANCE_MODEL_CASES=100000`) asks for; [`check_model`] returns the result instead of
//! panicking.
//!
//! # What it does
//!
//! - A sequence is up to [`ModelConfig::max_steps`] steps over 9 records: 3 scopes × 3 keys whose
//!   names differ only in case or in where a `:` falls (`("…/a", "b:k")` and `("…/a:b", "k")`), so
//!   a store that folds case or concatenates scope and key fails. Steps: `claim` (two possible
//!   requests per key, each claim with its own policy: lease 5 s or 30 s, ttl 60 s or 300 s,
//!   `Reconcile` or `Takeover`), `complete` (definitive, retryable under either cache policy, or
//!   over the size limit), `release`, `extend` (1 s, 10 s or 100 s), `get`, `list` (random
//!   filters and limits), `list_in_flight`, `purge_expired` (in batches) and clock moves chosen
//!   to land on lease and expiry boundaries.
//! - Races: `n` identical claims at once (the store's answers must be the model's for the same
//!   claims one after another, in any order: one winner at most), and a holder's `complete`,
//!   `release` or `extend` at the same time as `n` claims (the store's answers and record must be
//!   those of one serial order, the act after `k` of the claims for some `k`).
//! - `complete`, `release` and `extend` act with the address's latest token, an older one, the
//!   latest one with a different random id, or a token never handed out.
//! - The model is a map of [`Record`]s written only by the functions of [`idem_core::machine`];
//!   [`ListFilter`] and [`Record::is_stale_processing`] select what the lists must return. The
//!   model never restates a rule.
//! - Tokens: the store draws its own random token ids, the model its own. The first time the
//!   store hands out a token (a `Claimed` answer) it must have the model's `seq` and be new; from
//!   then on it stands for the model's token, in answers and in records. A record carrying a
//!   token the store never handed out is a failure.
//! - Every answer is compared, including `retry_after`, `attempt`, `kind`, the stored outcome
//!   byte for byte, lease deadlines and the exact purge counts. After each write the record at
//!   that address is read back and compared; at the end of the sequence all nine are.
//!   `list_in_flight` must return the model's records, earliest lease first (the order of records
//!   with equal leases is free).
//! - A purge step purges in batches until a batch comes back short, each batch's count exactly
//!   `min(expired left, limit)`, so the model knows which records are gone.
//! - Each sequence ends by moving the clock to the last expiry of its records and purging them
//!   all, checking the counts, so the next sequence starts on an empty namespace. Time only moves
//!   forward: each sequence starts well past the previous one's end. Every sequence (including
//!   the re-runs of shrinking) uses scopes of its own, and after a failed sequence (the namespace
//!   may then be left dirty) the factory is called again for a fresh namespace.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::machine::{
    self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer, Transition,
};
use idem_core::{
    CachePolicy, Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, OutcomeClass, Policy,
    Record, RecordState, Scope, StalePolicy, StoreError, Timestamp, Token,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use crate::StoreFactory;

/// The environment variable that sets how many sequences [`run_model`] runs.
pub const CASES_ENV: &str = "IDEM_CONFORMANCE_MODEL_CASES";
/// How many sequences [`run_model`] runs when [`CASES_ENV`] is not set.
pub const DEFAULT_CASES: u32 = 256;
/// The longest sequence, in steps, by default.
pub const DEFAULT_MAX_STEPS: usize = 24;
/// Progress goes to stderr every this many sequences (long runs can be followed).
const PROGRESS_EVERY: u64 = 5_000;
/// How long one sequence may take before it fails (a deadlocked store must not hang CI).
pub const SEQUENCE_TIMEOUT: Duration = Duration::from_secs(60);

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

/// How many sequences to run, and how long they may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The default, with the case count from [`CASES_ENV`] if it is set.
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
pub struct ModelStats {
    /// Sequences run (proptest cases).
    pub cases: u32,
    /// Steps run in all, not counting the reads and purges that check each sequence.
    pub steps: u64,
}

/// A failing run: the minimal failing sequence shrinking found, and why it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Runs the model-based test with [`ModelConfig::from_env`]; panics with the minimal failing
/// sequence if the store disagrees with the model.
///
/// `fresh_namespace` must return, on every call, a handle to a new, empty namespace nobody else
/// writes to while the test runs (see the [module docs](self)).
pub fn run_model(fresh_namespace: impl StoreFactory) -> ModelStats {
    match check_model(fresh_namespace, &ModelConfig::from_env()) {
        Ok(stats) => stats,
        Err(failure) => panic!("{failure}"),
    }
}

/// Runs the model-based test and returns the minimal failing sequence instead of panicking.
pub fn check_model(
    fresh_namespace: impl StoreFactory,
    config: &ModelConfig,
) -> Result<ModelStats, ModelFailure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runner = Runner {
        factory: Arc::new(fresh_namespace),
        store: std::sync::Mutex::new(None),
        next_start: AtomicU64::new(EPOCH.as_millis() + rand::random::<u32>() as u64),
        sequence: AtomicU64::new(0),
        steps: AtomicU64::new(0),
        run: rand::random(),
        started: std::time::Instant::now(),
        runtime,
    };
    let mut proptest = TestRunner::new(Config {
        cases: config.cases,
        failure_persistence: None,
        max_shrink_iters: 100_000,
        ..Config::default()
    });
    let result = proptest.run(&sequence_strategy(config.max_steps), |ops| {
        runner.run_sequence(&ops).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => Ok(ModelStats {
            cases: config.cases,
            steps: runner.steps.load(Ordering::Relaxed),
        }),
        Err(TestError::Fail(reason, ops)) => Err(ModelFailure {
            sequence: render(&ops),
            message: reason.message().to_owned(),
        }),
        Err(TestError::Abort(reason)) => Err(ModelFailure {
            sequence: String::new(),
            message: format!("aborted: {}", reason.message()),
        }),
    }
}

/// One record's address: indexes into [`SCOPES`] and [`KEYS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Addr {
    scope: usize,
    key: usize,
}

/// A policy, by its parts.
#[derive(Debug, Clone, Copy)]
struct Pol {
    lease: usize,
    ttl: usize,
    takeover: bool,
    cache_all: bool,
}

impl Pol {
    fn policy(self, max_outcome_bytes: usize) -> Policy {
        Policy::builder()
            .lease(LEASES[self.lease])
            .ttl(TTLS[self.ttl])
            .stale(if self.takeover {
                StalePolicy::Takeover
            } else {
                StalePolicy::Reconcile
            })
            .cache(if self.cache_all {
                CachePolicy::CacheAll
            } else {
                CachePolicy::DefinitiveOnly
            })
            .max_outcome_bytes(max_outcome_bytes)
            .build()
            .expect("valid policy")
    }
}

/// Which token a holder acts with.
#[derive(Debug, Clone)]
enum Holder {
    /// The latest token handed out for the address.
    Latest,
    /// Any token handed out for the address.
    Earlier(Index),
    /// The latest token's `seq` with another id.
    Forged,
    /// A token nobody was handed.
    Never,
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Definitive(u8),
    Retryable,
    TooLarge,
}

/// What the holder does in a [`Op::HolderRace`].
#[derive(Debug, Clone, Copy)]
enum Act {
    Complete(Out),
    Release,
    Extend(usize),
}

/// The holder's answer in a [`Op::HolderRace`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Acted {
    Complete(CompleteAnswer),
    Release(ReleaseAnswer),
    Extend(ExtendAnswer),
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        at: Addr,
        other_request: bool,
        pol: Pol,
    },
    Complete {
        at: Addr,
        holder: Holder,
        out: Out,
        pol: Pol,
    },
    Release {
        at: Addr,
        holder: Holder,
    },
    Extend {
        at: Addr,
        holder: Holder,
        lease: usize,
    },
    /// A holder's complete, release or extend at the same time as `n` identical claims.
    HolderRace {
        at: Addr,
        holder: Holder,
        act: Act,
        n: usize,
        pol: Pol,
    },
    /// `n` identical claims at once, from `n` tasks.
    ClaimRace {
        at: Addr,
        n: usize,
        pol: Pol,
    },
    Get {
        at: Addr,
    },
    List {
        state: Option<RecordState>,
        scope: Option<usize>,
        age_ms: Option<u64>,
        limit: usize,
    },
    ListInFlight {
        back_ms: u64,
        limit: usize,
    },
    Purge {
        limit: usize,
    },
    Advance {
        ms: u64,
    },
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({:?}, {:?})", SCOPES[self.scope], KEYS[self.key])
    }
}

impl fmt::Display for Pol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {:?}, ttl {:?}, {}, {}",
            LEASES[self.lease],
            TTLS[self.ttl],
            if self.takeover {
                "takeover"
            } else {
                "reconcile"
            },
            if self.cache_all {
                "cache_all"
            } else {
                "definitive_only"
            }
        )
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Latest => f.write_str("latest token"),
            Self::Earlier(_) => f.write_str("an earlier token"),
            Self::Forged => f.write_str("latest seq, forged id"),
            Self::Never => f.write_str("token never handed out"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claim {
                at,
                other_request,
                pol,
            } => write!(
                f,
                "claim {at} request {} [{pol}]",
                if *other_request { "B" } else { "A" }
            ),
            Self::Complete {
                at,
                holder,
                out,
                pol,
            } => {
                let out = match out {
                    Out::Definitive(n) => format!("definitive 201 T-{n}"),
                    Out::Retryable => "retryable 503".to_owned(),
                    Out::TooLarge => format!("over a {SMALL_LIMIT}-byte limit"),
                };
                write!(f, "complete {at} with {holder}: {out} [{pol}]")
            }
            Self::Release { at, holder } => write!(f, "release {at} with {holder}"),
            Self::Extend { at, holder, lease } => {
                write!(f, "extend {at} with {holder} by {:?}", EXTENDS[*lease])
            }
            Self::HolderRace {
                at,
                holder,
                act,
                n,
                pol,
            } => {
                let act = match act {
                    Act::Complete(Out::Definitive(n)) => format!("complete (definitive 201 T-{n})"),
                    Act::Complete(_) => "complete (retryable 503)".to_owned(),
                    Act::Release => "release".to_owned(),
                    Act::Extend(l) => format!("extend by {:?}", EXTENDS[*l]),
                };
                write!(
                    f,
                    "{act} of {at} with {holder}, at the same time as {n} claims, request A [{pol}]"
                )
            }
            Self::ClaimRace { at, n, pol } => {
                write!(f, "{n} concurrent claims of {at}, request A [{pol}]")
            }
            Self::Get { at } => write!(f, "get {at}"),
            Self::List {
                state,
                scope,
                age_ms,
                limit,
            } => {
                write!(f, "list limit {limit}")?;
                if let Some(s) = state {
                    write!(f, ", state {s}")?;
                }
                if let Some(s) = scope {
                    write!(f, ", scope {:?}", SCOPES[*s])?;
                }
                if let Some(a) = age_ms {
                    write!(f, ", updated at least {a} ms ago")?;
                }
                Ok(())
            }
            Self::ListInFlight { back_ms, limit } => {
                write!(
                    f,
                    "list_in_flight older than now - {back_ms} ms, limit {limit}"
                )
            }
            Self::Purge { limit } => write!(f, "purge_expired in batches of {limit}"),
            Self::Advance { ms } => write!(f, "advance the clock {ms} ms"),
        }
    }
}

fn render(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        out.push_str(&format!("  {:>2}. {op}\n", i + 1));
    }
    out.push_str("  (then: the clock moves to the last expiry and everything is purged)");
    out
}

fn addr() -> impl Strategy<Value = Addr> {
    (0..SCOPES.len(), 0..KEYS.len()).prop_map(|(scope, key)| Addr { scope, key })
}

fn pol() -> impl Strategy<Value = Pol> {
    (0..LEASES.len(), 0..TTLS.len(), any::<bool>(), any::<bool>()).prop_map(
        |(lease, ttl, takeover, cache_all)| Pol {
            lease,
            ttl,
            takeover,
            cache_all,
        },
    )
}

fn holder() -> impl Strategy<Value = Holder> {
    prop_oneof![
        6 => Just(Holder::Latest),
        2 => any::<Index>().prop_map(Holder::Earlier),
        1 => Just(Holder::Forged),
        1 => Just(Holder::Never),
    ]
}

fn out() -> impl Strategy<Value = Out> {
    prop_oneof![
        4 => (0u8..4).prop_map(Out::Definitive),
        3 => Just(Out::Retryable),
        1 => Just(Out::TooLarge),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        2 => (0u8..4).prop_map(|n| Act::Complete(Out::Definitive(n))),
        1 => Just(Act::Complete(Out::Retryable)),
        1 => Just(Act::Release),
        1 => (0..EXTENDS.len()).prop_map(Act::Extend),
    ]
}

fn clock_move() -> impl Strategy<Value = u64> {
    // Steps that land on lease and expiry boundaries (5 s, 30 s, 60 s, 300 s), just short of and
    // just past them, and anything else.
    prop_oneof![
        Just(1u64),
        Just(999),
        Just(1_000),
        Just(4_999),
        Just(5_000),
        Just(25_000),
        Just(30_000),
        Just(60_000),
        Just(300_000),
        0u64..400_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let state = prop_oneof![
        Just(None),
        Just(Some(RecordState::Processing)),
        Just(Some(RecordState::Completed)),
        Just(Some(RecordState::FailedRetryable)),
    ];
    let limit = prop_oneof![1usize..4, Just(100)];
    prop_oneof![
        5 => (addr(), prop::bool::weighted(0.15), pol()).prop_map(|(at, other_request, pol)| {
            Op::Claim { at, other_request, pol }
        }),
        3 => (addr(), holder(), out(), pol()).prop_map(|(at, holder, out, pol)| {
            Op::Complete { at, holder, out, pol }
        }),
        1 => (addr(), holder()).prop_map(|(at, holder)| Op::Release { at, holder }),
        2 => (addr(), holder(), 0..EXTENDS.len())
            .prop_map(|(at, holder, lease)| Op::Extend { at, holder, lease }),
        1 => (addr(), 2usize..9, pol()).prop_map(|(at, n, pol)| Op::ClaimRace { at, n, pol }),
        1 => (addr(), holder(), act(), 1usize..5, pol()).prop_map(|(at, holder, act, n, pol)| {
            Op::HolderRace { at, holder, act, n, pol }
        }),
        2 => addr().prop_map(|at| Op::Get { at }),
        1 => (
            state,
            prop::option::of(0..SCOPES.len()),
            prop::option::of(prop_oneof![Just(0u64), Just(1_000), 0u64..100_000]),
            limit.clone(),
        )
            .prop_map(|(state, scope, age_ms, limit)| Op::List { state, scope, age_ms, limit }),
        1 => (prop_oneof![Just(0u64), Just(1_000), 0u64..60_000], limit.clone())
            .prop_map(|(back_ms, limit)| Op::ListInFlight { back_ms, limit }),
        1 => (1usize..4).prop_map(|limit| Op::Purge { limit }),
        4 => clock_move().prop_map(|ms| Op::Advance { ms }),
    ]
}

fn sequence_strategy(max_steps: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max_steps.max(1))
}

/// What the run keeps between sequences.
struct Runner {
    factory: Arc<dyn StoreFactory>,
    /// The namespace in use; `None` after a failed sequence (it may be dirty).
    store: std::sync::Mutex<Option<Arc<dyn KeyStore>>>,
    next_start: AtomicU64,
    sequence: AtomicU64,
    steps: AtomicU64,
    run: u64,
    started: std::time::Instant,
    runtime: tokio::runtime::Runtime,
}

impl Runner {
    fn run_sequence(&self, ops: &[Op]) -> Result<(), String> {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        if n > 0 && n.is_multiple_of(PROGRESS_EVERY) {
            eprintln!(
                "idem-conformance model: {n} sequences run in {:.1?}",
                self.started.elapsed()
            );
        }
        let start = Timestamp::from_millis(self.next_start.load(Ordering::Relaxed));
        let existing = self.store.lock().unwrap_or_else(|e| e.into_inner()).take();
        let factory = self.factory.clone();
        let run = self.run;
        let ops_owned = ops.to_vec();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.runtime.block_on(async move {
                let store = match existing {
                    Some(store) => store,
                    None => factory.make().await,
                };
                let world = World::new(store.clone(), run, n, start);
                let result = tokio::time::timeout(SEQUENCE_TIMEOUT, world.play(ops_owned)).await;
                (store, result)
            })
        }));
        match outcome {
            Ok((store, Ok(Ok((end, steps))))) => {
                self.steps.fetch_add(steps, Ordering::Relaxed);
                // Past the end by more than any ttl, so nothing of this sequence is near.
                let next = end + TTLS[TTLS.len() - 1] + EXTENDS[EXTENDS.len() - 1];
                self.next_start.store(next.as_millis(), Ordering::Relaxed);
                *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
                Ok(())
            }
            failed => {
                // The namespace may be dirty: the next sequence gets a fresh one, and starts a
                // day later.
                self.next_start.store(
                    (start + Duration::from_secs(24 * 3600)).as_millis(),
                    Ordering::Relaxed,
                );
                Err(match failed {
                    Ok((_, Ok(Err(why)))) => why,
                    Ok((_, Err(_))) => {
                        format!("the sequence did not finish within {SEQUENCE_TIMEOUT:?}")
                    }
                    Err(payload) => format!(
                        "the store panicked: {}",
                        crate::panic_message(payload.as_ref())
                    ),
                    Ok((_, Ok(Ok(_)))) => unreachable!(),
                })
            }
        }
    }
}

/// One token handed out: as the store knows it, and as the model does.
#[derive(Debug, Clone, Copy)]
struct Issued {
    store: Token,
    model: Token,
}

/// One sequence: the store, the model, and the translation between their tokens.
struct World {
    store: Arc<dyn KeyStore>,
    model: HashMap<Addr, Record>,
    scopes: Vec<Scope>,
    keys: Vec<IdempotencyKey>,
    requests: [Fingerprint; 2],
    now: Timestamp,
    /// Store token → model token, for every token the store handed out.
    tokens: HashMap<Token, Token>,
    /// The tokens handed out per address, oldest first.
    issued: HashMap<Addr, Vec<Issued>>,
    next_model_id: u128,
    step: usize,
    op: String,
}

type Checked<T = ()> = Result<T, String>;

impl World {
    fn new(store: Arc<dyn KeyStore>, run: u64, sequence: u64, start: Timestamp) -> Self {
        let scopes = SCOPES
            .iter()
            .map(|s| {
                Scope::new(format!("idem-model/{run:016x}/{sequence}/{s}")).expect("valid scope")
            })
            .collect();
        let keys = KEYS
            .iter()
            .map(|k| IdempotencyKey::new(*k).expect("valid key"))
            .collect();
        let request = |title: &str| {
            Fingerprint::of("create_ticket", &serde_json::json!({ "title": title }))
                .expect("fingerprint")
        };
        Self {
            store,
            model: HashMap::new(),
            scopes,
            keys,
            requests: [request("A"), request("B")],
            now: start,
            tokens: HashMap::new(),
            issued: HashMap::new(),
            next_model_id: 2,
            step: 0,
            op: String::new(),
        }
    }

    fn fail<T>(&self, what: impl fmt::Display) -> Checked<T> {
        Err(format!(
            "step {} ({}), at {}: {what}",
            self.step, self.op, self.now
        ))
    }

    fn store_error<T>(&self, call: &str, e: StoreError) -> Checked<T> {
        self.fail(format!("{call} failed: {e}"))
    }

    /// Plays the sequence, then empties the namespace; returns the end time and step count.
    async fn play(mut self, ops: Vec<Op>) -> Checked<(Timestamp, u64)> {
        for (i, op) in ops.iter().enumerate() {
            self.step = i + 1;
            self.op = op.to_string();
            self.apply(op).await?;
        }
        self.step = ops.len() + 1;
        self.op = "final check of every record".into();
        for scope in 0..SCOPES.len() {
            for key in 0..KEYS.len() {
                self.compare_record(Addr { scope, key }).await?;
            }
        }
        // Everything expires; purge it all in batches of 3 and check the counts.
        let end = self
            .model
            .values()
            .map(|r| r.expires_at)
            .max()
            .unwrap_or(self.now)
            .max(self.now);
        self.now = end;
        self.op = "clean-up: purge everything at the last expiry".into();
        self.purge(3).await?;
        if !self.model.is_empty() {
            return self.fail("the model kept records after the clean-up purge");
        }
        Ok((end, ops.len() as u64))
    }

    fn addr(&self, at: Addr) -> (&Scope, &IdempotencyKey) {
        (&self.scopes[at.scope], &self.keys[at.key])
    }

    /// The record the model holds for `at`, as `get` must return it at `now`.
    fn model_live(&self, at: Addr) -> Option<Record> {
        self.model
            .get(&at)
            .filter(|r| !r.is_expired(self.now))
            .cloned()
    }

    fn write<A>(&mut self, at: Addr, t: Transition<A>) -> A {
        if let Some(record) = t.write {
            self.model.insert(at, record);
        }
        t.answer
    }

    /// The store's record, with its token translated to the model's.
    fn translate(&self, record: Record) -> Checked<Record> {
        match self.tokens.get(&record.token) {
            Some(model) => Ok(Record {
                token: *model,
                ..record
            }),
            None => self.fail(format!(
                "the store returned a record of ({}, {}) with token {:?}, which it never handed out",
                record.scope, record.key, record.token
            )),
        }
    }

    async fn compare_record(&self, at: Addr) -> Checked {
        let (scope, key) = self.addr(at);
        let got = match self.store.get(scope, key, self.now).await {
            Ok(r) => r,
            Err(e) => return self.store_error("get", e),
        };
        let got = got.map(|r| self.translate(r)).transpose()?;
        let want = self.model_live(at);
        if got != want {
            return self.fail(format!(
                "get {at}: the store has\n    {got:?}\n  the model has\n    {want:?}"
            ));
        }
        Ok(())
    }

    /// The token a holder acts with: (for the store, for the model).
    fn token(&self, at: Addr, holder: &Holder) -> (Token, Token) {
        let never = Token::with_id(1, NEVER_ID);
        let issued = self.issued.get(&at).map(Vec::as_slice).unwrap_or_default();
        let Some(latest) = issued.last() else {
            return (never, never);
        };
        match holder {
            Holder::Latest => (latest.store, latest.model),
            Holder::Earlier(i) => {
                let t = issued[i.index(issued.len())];
                (t.store, t.model)
            }
            // Model ids are even, so `| 1` is no model token; a store id with its lowest bit
            // flipped is, with overwhelming probability, no store token.
            Holder::Forged => (
                Token::with_id(latest.store.seq, latest.store.id ^ 1),
                Token::with_id(latest.model.seq, latest.model.id | 1),
            ),
            Holder::Never => (never, never),
        }
    }

    fn outcome(out: Out) -> Outcome {
        match out {
            Out::Definitive(n) => Outcome::definitive(
                201,
                &serde_json::json!({ "ticket_id": format!("T-{n}"), "note": "é 😀 \"q\"" }),
            )
            .expect("outcome"),
            Out::Retryable => Outcome::new(
                503,
                &serde_json::json!({ "error": "upstream timeout" }),
                OutcomeClass::Retryable,
            )
            .expect("outcome"),
            Out::TooLarge => {
                Outcome::definitive(200, &serde_json::json!({ "body": "x".repeat(32) }))
                    .expect("outcome")
            }
        }
    }

    async fn apply(&mut self, op: &Op) -> Checked {
        let store = self.store.clone();
        let now = self.now;
        match op {
            Op::Advance { ms } => {
                self.now = self.now + Duration::from_millis(*ms);
            }
            Op::Claim {
                at,
                other_request,
                pol,
            } => {
                let at = *at;
                let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
                let fingerprint = self.requests[usize::from(*other_request)].clone();
                let (scope, key) = self.addr(at);
                let (scope, key) = (scope.clone(), key.clone());
                let token_id = self.next_model_id;
                self.next_model_id += 2;
                let req = ClaimRequest {
                    scope: &scope,
                    key: &key,
                    fingerprint: &fingerprint,
                    token_id,
                };
                let t = machine::claim(self.model.get(&at), req, now, &policy);
                let got = match store.claim(&scope, &key, &fingerprint, &policy, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("claim", e),
                };
                let want = t.answer.clone();
                match (&got, &want) {
                    (
                        ClaimAnswer::Claimed {
                            token: st,
                            attempt: sa,
                            kind: sk,
                        },
                        ClaimAnswer::Claimed {
                            token: mt,
                            attempt: ma,
                            kind: mk,
                        },
                    ) if sa == ma && sk == mk && st.seq == mt.seq => {
                        if self.tokens.contains_key(st) {
                            return self
                                .fail(format!("the store handed out token {st:?} a second time"));
                        }
                        self.tokens.insert(*st, *mt);
                        self.issued.entry(at).or_default().push(Issued {
                            store: *st,
                            model: *mt,
                        });
                    }
                    _ if got == want => {}
                    _ => {
                        return self.fail(format!(
                            "claim {at}: the store answered\n    {got:?}\n  the model\n    {want:?}"
                        ));
                    }
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::Complete {
                at,
                holder,
                out,
                pol,
            } => {
                let at = *at;
                let limit = match out {
                    Out::TooLarge => SMALL_LIMIT,
                    _ => Policy::DEFAULT_MAX_OUTCOME_BYTES,
                };
                let policy = pol.policy(limit);
                let outcome = Self::outcome(*out);
                let (st, mt) = self.token(at, holder);
                let (scope, key) = self.addr(at);
                let got = store.complete(scope, key, st, &outcome, &policy, now).await;
                let t = machine::complete(self.model.get(&at), mt, &outcome, now, &policy);
                match (got, t) {
                    (Ok(got), Ok(t)) if got == t.answer => {
                        self.write(at, t);
                    }
                    (Err(StoreError::OutcomeTooLarge(got)), Err(want)) if got == want => {}
                    (got, want) => {
                        let want = want.map(|t| t.answer);
                        return self.fail(format!(
                            "complete {at}: the store answered\n    {got:?}\n  the model\n    {want:?}"
                        ));
                    }
                }
                self.compare_record(at).await?;
            }
            Op::Release { at, holder } => {
                let at = *at;
                let (st, mt) = self.token(at, holder);
                let (scope, key) = self.addr(at);
                let got = match store.release(scope, key, st, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("release", e),
                };
                let t = machine::release(self.model.get(&at), mt, now);
                if got != t.answer {
                    return self.fail(format!(
                        "release {at}: the store answered {got:?}, the model {:?}",
                        t.answer
                    ));
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::Extend { at, holder, lease } => {
                let at = *at;
                let lease = EXTENDS[*lease];
                let (st, mt) = self.token(at, holder);
                let (scope, key) = self.addr(at);
                let got = match store.extend(scope, key, st, lease, now).await {
                    Ok(a) => a,
                    Err(e) => return self.store_error("extend", e),
                };
                let t = machine::extend(self.model.get(&at), mt, lease, now)
                    .expect("the model's leases are not zero");
                if got != t.answer {
                    return self.fail(format!(
                        "extend {at}: the store answered {got:?}, the model {:?}",
                        t.answer
                    ));
                }
                self.write(at, t);
                self.compare_record(at).await?;
            }
            Op::ClaimRace { at, n, pol } => self.claim_race(*at, *n, *pol).await?,
            Op::HolderRace {
                at,
                holder,
                act,
                n,
                pol,
            } => self.holder_race(*at, holder, *act, *n, *pol).await?,
            Op::Get { at } => self.compare_record(*at).await?,
            Op::List {
                state,
                scope,
                age_ms,
                limit,
            } => {
                let filter = ListFilter {
                    state: *state,
                    scope: scope.map(|s| self.scopes[s].clone()),
                    updated_before: age_ms.map(|a| now - Duration::from_millis(a)),
                };
                let got = match store.list(&filter, now, *limit).await {
                    Ok(l) => l,
                    Err(e) => return self.store_error("list", e),
                };
                let got = got
                    .into_iter()
                    .map(|r| self.translate(r))
                    .collect::<Checked<Vec<_>>>()?;
                let mut want: Vec<Record> = self
                    .model
                    .values()
                    .filter(|r| filter.matches(r, now))
                    .cloned()
                    .collect();
                ListFilter::order_and_truncate(&mut want, *limit);
                if got != want {
                    return self.fail(format!(
                        "list: the store returned\n{}\n  the model\n{}",
                        lines(&got),
                        lines(&want)
                    ));
                }
            }
            Op::ListInFlight { back_ms, limit } => {
                let older_than = now - Duration::from_millis(*back_ms);
                let got = match store.list_in_flight(older_than, *limit).await {
                    Ok(l) => l,
                    Err(e) => return self.store_error("list_in_flight", e),
                };
                let got = got
                    .into_iter()
                    .map(|r| self.translate(r))
                    .collect::<Checked<Vec<_>>>()?;
                let mut eligible: Vec<Record> = self
                    .model
                    .values()
                    .filter(|r| r.is_stale_processing(older_than))
                    .cloned()
                    .collect();
                eligible.sort_by(|a, b| {
                    (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
                });
                // Earliest lease first; among equal leases any order (and, at the limit, any
                // choice) is right.
                let want_leases: Vec<Timestamp> = eligible
                    .iter()
                    .take(*limit)
                    .map(|r| r.lease_until)
                    .collect();
                let got_leases: Vec<Timestamp> = got.iter().map(|r| r.lease_until).collect();
                let mut seen = HashSet::new();
                let all_eligible = got
                    .iter()
                    .all(|r| eligible.contains(r) && seen.insert((r.scope.clone(), r.key.clone())));
                if got_leases != want_leases || !all_eligible {
                    return self.fail(format!(
                        "list_in_flight({older_than}, {limit}): the store returned\n{}\n  the model's stale records are\n{}",
                        lines(&got),
                        lines(&eligible)
                    ));
                }
            }
            Op::Purge { limit } => self.purge(*limit).await?,
        }
        Ok(())
    }

    /// `n` identical claims at once: the model's answers are those of the same claims one after
    /// another (the first may win; the others then see it in flight), the store's must be the
    /// same, in any order.
    async fn claim_race(&mut self, at: Addr, n: usize, pol: Pol) -> Checked {
        let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
        let fingerprint = self.requests[0].clone();
        let (scope, key) = self.addr(at);
        let (scope, key) = (scope.clone(), key.clone());
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (store, scope, key, fingerprint) = (
                    self.store.clone(),
                    scope.clone(),
                    key.clone(),
                    fingerprint.clone(),
                );
                let now = self.now;
                tokio::spawn(
                    async move { store.claim(&scope, &key, &fingerprint, &policy, now).await },
                )
            })
            .collect();
        let mut got = Vec::with_capacity(n);
        for task in tasks {
            match task.await {
                Ok(Ok(answer)) => got.push(answer),
                Ok(Err(e)) => return self.store_error("claim", e),
                Err(join) => return self.fail(format!("a claim task failed: {join}")),
            }
        }
        let mut want = Vec::with_capacity(n);
        for _ in 0..n {
            let token_id = self.next_model_id;
            self.next_model_id += 2;
            let req = ClaimRequest {
                scope: &scope,
                key: &key,
                fingerprint: &fingerprint,
                token_id,
            };
            let t = machine::claim(self.model.get(&at), req, self.now, &policy);
            want.push(self.write(at, t));
        }
        let won = |a: &ClaimAnswer| matches!(a, ClaimAnswer::Claimed { .. });
        let mismatch = |this: &Self| {
            this.fail::<()>(format!(
                "{n} concurrent claims of {at}: the store answered\n    {got:?}\n  the model (in some order)\n    {want:?}"
            ))
        };
        let got_won: Vec<&ClaimAnswer> = got.iter().filter(|a| won(a)).collect();
        let want_won: Vec<&ClaimAnswer> = want.iter().filter(|a| won(a)).collect();
        if got_won.len() != want_won.len() {
            return mismatch(self);
        }
        if let (
            [
                ClaimAnswer::Claimed {
                    token: st,
                    attempt: sa,
                    kind: sk,
                },
            ],
            [
                ClaimAnswer::Claimed {
                    token: mt,
                    attempt: ma,
                    kind: mk,
                },
            ],
        ) = (got_won.as_slice(), want_won.as_slice())
        {
            if sa != ma || sk != mk || st.seq != mt.seq {
                return mismatch(self);
            }
            if self.tokens.contains_key(st) {
                return self.fail(format!("the store handed out token {st:?} a second time"));
            }
            self.tokens.insert(*st, *mt);
            self.issued.entry(at).or_default().push(Issued {
                store: *st,
                model: *mt,
            });
        }
        let mut rest: Vec<&ClaimAnswer> = want.iter().filter(|a| !won(a)).collect();
        for answer in got.iter().filter(|a| !won(a)) {
            match rest.iter().position(|w| *w == answer) {
                Some(i) => {
                    rest.swap_remove(i);
                }
                None => return mismatch(self),
            }
        }
        self.compare_record(at).await
    }

    /// The model's rule for a holder's act on `found`.
    fn act_rule(
        found: Option<&Record>,
        act: Act,
        token: Token,
        now: Timestamp,
        policy: &Policy,
    ) -> Transition<Acted> {
        let wrap = |write, answer| Transition { answer, write };
        match act {
            Act::Complete(out) => {
                let t = machine::complete(found, token, &Self::outcome(out), now, policy)
                    .expect("race outcomes are within the limit");
                wrap(t.write, Acted::Complete(t.answer))
            }
            Act::Release => {
                let t = machine::release(found, token, now);
                wrap(t.write, Acted::Release(t.answer))
            }
            Act::Extend(lease) => {
                let t = machine::extend(found, token, EXTENDS[lease], now)
                    .expect("the model's leases are not zero");
                wrap(t.write, Acted::Extend(t.answer))
            }
        }
    }

    /// A holder's act and `n` identical claims at once. The store's answers and record must be
    /// those of one serial order: the act after `k` of the claims, for some `k` in `0..=n`.
    async fn holder_race(
        &mut self,
        at: Addr,
        holder: &Holder,
        act: Act,
        n: usize,
        pol: Pol,
    ) -> Checked {
        let policy = pol.policy(Policy::DEFAULT_MAX_OUTCOME_BYTES);
        let fingerprint = self.requests[0].clone();
        let (scope, key) = self.addr(at);
        let (scope, key) = (scope.clone(), key.clone());
        let (st, mt) = self.token(at, holder);
        let now = self.now;

        let acting = {
            let (store, scope, key) = (self.store.clone(), scope.clone(), key.clone());
            tokio::spawn(async move {
                Ok::<_, StoreError>(match act {
                    Act::Complete(out) => Acted::Complete(
                        store
                            .complete(&scope, &key, st, &Self::outcome(out), &policy, now)
                            .await?,
                    ),
                    Act::Release => Acted::Release(store.release(&scope, &key, st, now).await?),
                    Act::Extend(lease) => {
                        Acted::Extend(store.extend(&scope, &key, st, EXTENDS[lease], now).await?)
                    }
                })
            })
        };
        let claims: Vec<_> = (0..n)
            .map(|_| {
                let (store, scope, key, fingerprint) = (
                    self.store.clone(),
                    scope.clone(),
                    key.clone(),
                    fingerprint.clone(),
                );
                tokio::spawn(
                    async move { store.claim(&scope, &key, &fingerprint, &policy, now).await },
                )
            })
            .collect();
        let got_act = match acting.await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return self.store_error("the holder's call", e),
            Err(join) => return self.fail(format!("the holder's task failed: {join}")),
        };
        let mut got = Vec::with_capacity(n);
        for task in claims {
            match task.await {
                Ok(Ok(answer)) => got.push(answer),
                Ok(Err(e)) => return self.store_error("claim", e),
                Err(join) => return self.fail(format!("a claim task failed: {join}")),
            }
        }
        let stored = match self.store.get(&scope, &key, now).await {
            Ok(r) => r,
            Err(e) => return self.store_error("get", e),
        };

        let won = |a: &ClaimAnswer| matches!(a, ClaimAnswer::Claimed { .. });
        let first_id = self.next_model_id;
        self.next_model_id += 2 * n as u128 + 2;
        let mut orders = Vec::new();
        for k in 0..=n {
            let mut record = self.model.get(&at).cloned();
            let mut answers = Vec::with_capacity(n);
            let mut acted = None;
            for i in 0..=n {
                if i == k {
                    let t = Self::act_rule(record.as_ref(), act, mt, now, &policy);
                    if let Some(w) = t.write {
                        record = Some(w);
                    }
                    acted = Some(t.answer);
                }
                if i == n {
                    break;
                }
                let req = ClaimRequest {
                    scope: &scope,
                    key: &key,
                    fingerprint: &fingerprint,
                    token_id: first_id + 2 * i as u128,
                };
                let t = machine::claim(record.as_ref(), req, now, &policy);
                if let Some(w) = t.write {
                    record = Some(w);
                }
                answers.push(t.answer);
            }
            let acted = acted.expect("the act is in every order");
            orders.push((k, acted, answers, record));
        }

        for (_, acted, want, record) in &orders {
            if *acted != got_act {
                continue;
            }
            let got_won: Vec<&ClaimAnswer> = got.iter().filter(|a| won(a)).collect();
            let want_won: Vec<&ClaimAnswer> = want.iter().filter(|a| won(a)).collect();
            if got_won.len() != want_won.len() {
                continue;
            }
            let mut pair = None;
            if let (
                [
                    ClaimAnswer::Claimed {
                        token: gt,
                        attempt: ga,
                        kind: gk,
                    },
                ],
                [
                    ClaimAnswer::Claimed {
                        token: wt,
                        attempt: wa,
                        kind: wk,
                    },
                ],
            ) = (got_won.as_slice(), want_won.as_slice())
            {
                if ga != wa || gk != wk || gt.seq != wt.seq || self.tokens.contains_key(gt) {
                    continue;
                }
                pair = Some((*gt, *wt));
            }
            let mut rest: Vec<&ClaimAnswer> = want.iter().filter(|a| !won(a)).collect();
            let others_match =
                got.iter()
                    .filter(|a| !won(a))
                    .all(|a| match rest.iter().position(|w| *w == a) {
                        Some(i) => {
                            rest.swap_remove(i);
                            true
                        }
                        None => false,
                    });
            if !others_match {
                continue;
            }
            // The store's record with its token translated (`None`: a token nobody was handed).
            let translated: Option<Option<Record>> = match stored.clone() {
                None => Some(None),
                Some(mut r) => {
                    let model_token = match pair {
                        Some((gt, wt)) if r.token == gt => Some(wt),
                        _ => self.tokens.get(&r.token).copied(),
                    };
                    model_token.map(|t| {
                        r.token = t;
                        Some(r)
                    })
                }
            };
            if translated != Some(record.clone().filter(|r| !r.is_expired(now))) {
                continue;
            }
            // This order explains everything the store did: adopt it.
            if let Some((gt, wt)) = pair {
                self.tokens.insert(gt, wt);
                self.issued.entry(at).or_default().push(Issued {
                    store: gt,
                    model: wt,
                });
            }
            match record {
                Some(r) => {
                    self.model.insert(at, r.clone());
                }
                None => {
                    self.model.remove(&at);
                }
            }
            return Ok(());
        }
        let orders: Vec<String> = orders
            .iter()
            .map(|(k, acted, answers, record)| {
                format!("    after {k} claims: {acted:?}, claims {answers:?}, record {record:?}")
            })
            .collect();
        self.fail(format!(
            "no serial order explains what the store did: the holder got {got_act:?}, the claims \
             {got:?}, and the record is\n    {stored:?}\n  the orders the model allows:\n{}",
            orders.join("\n")
        ))
    }

    /// Purges in batches of `limit` until a batch is short, checking every count, then drops the
    /// expired records from the model.
    async fn purge(&mut self, limit: usize) -> Checked {
        let now = self.now;
        let mut left = self.model.values().filter(|r| r.is_expired(now)).count();
        // Bounded: a store that keeps answering `limit` must not loop forever.
        for batch in 1..=self.model.len() + 2 {
            let got = match self.store.purge_expired(now, limit).await {
                Ok(n) => n,
                Err(e) => return self.store_error("purge_expired", e),
            };
            let want = left.min(limit);
            if got != want {
                return self.fail(format!(
                    "purge_expired({now}, {limit}), batch {batch}: the store deleted {got}, the model expected {want} ({left} expired records left)"
                ));
            }
            left -= got;
            if got < limit {
                self.model.retain(|_, r| !r.is_expired(now));
                return Ok(());
            }
        }
        self.fail(format!(
            "purge_expired({now}, {limit}) kept answering {limit}"
        ))
    }
}

fn lines(records: &[Record]) -> String {
    if records.is_empty() {
        return "    (none)".to_owned();
    }
    records
        .iter()
        .map(|r| format!("    {r:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}
