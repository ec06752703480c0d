//! The conformance suite every idem [`KeyStore`](idem_core::KeyStore) runs: each guarantee of
//! [contract §3](idem_core::contract#guarantees) and each row of the [contract
//! §2](idem_core::contract#states) table as its own named case.
//!
//! ```
//! use idem_core::MemoryStore;
//! // The claim cases against the reference store. The factory hands out handles to one storage,
//! // as a real backend's factory opens new connections to one database.
//! let shared = MemoryStore::new();
//! let factory = move || {
//!     let store = shared.clone();
//!     async move { store }
//! };
//! let report = idem_conformance::run_matching(factory, |case| case.starts_with("claim_"));
//! report.assert_all_passed();
//! assert!(report.passed.len() > 10);
//! ```
//!
//! # Running it against your store
//!
//! Add `idem-conformance` to your store crate's `[dev-dependencies]` and write
//! `tests/conformance.rs`:
//!
//! ```no_run
//! # mod my_store {
//! #     pub struct MyStore;
//! #     impl MyStore {
//! #         pub async fn connect(_url: &str) -> Result<idem_core::MemoryStore, std::io::Error> {
//! #             Ok(idem_core::MemoryStore::new())
//! #         }
//! #     }
//! # }
//! // One #[test] per case. The factory is called at least once per case (many times in the
//! // concurrency cases); each call opens a new handle to the same database.
//! idem_conformance::conformance_tests!(|| async {
//!     my_store::MyStore::connect("postgres://localhost/idem_test").await.unwrap()
//! });
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs every case, `cargo test claim_` the claim cases,
//! `cargo test fencing_` the fencing cases, and a failure names its case. Attributes written
//! before the factory go on every generated test
//! (`conformance_tests!(#[ignore = "needs a server"] factory)`). No `#[tokio::test]` is needed:
//! each case builds its own multi-threaded tokio runtime, so the factory may create pools bound
//! to it. A store whose handles share storage in the process hands out clones of one store:
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! idem_conformance::conformance_tests!({
//!     let shared = MemoryStore::new();
//!     move || {
//!         let store = shared.clone();
//!         async move { store }
//!     }
//! });
//! # fn main() {}
//! ```
//!
//! Or run everything at once and get every failure, not just the first ([`run_all`];
//! [`run_matching`] for the cases a filter picks, [`run_streaming`] to see each case as it
//! finishes):
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! let shared = MemoryStore::new();
//! let report = idem_conformance::run_all(move || {
//!     let store = shared.clone();
//!     async move { store }
//! });
//! println!("{report}");
//! report.assert_all_passed();
//! ```
//!
//! [`cases()`] lists the cases (name and group) and [`run_case`] runs one by name. A case that
//! takes more than 120 s fails (a deadlocked store must not hang CI).
//!
//! # The model-based test
//!
//! Beside the named cases, [`run_model`] drives random sequences of every operation (claim,
//! concurrent claims, complete, release, extend, checkpoint, get, list, list_in_flight,
//! purge_expired) and clock moves against the pure rules of `idem_core::machine` over a map and
//! against your store, compares every answer and every record, and on failure panics with the
//! minimal failing sequence proptest's shrinking found. Unlike the cases, it needs a factory of
//! fresh, empty, private namespaces (purge counts and lists are compared exactly); see
//! [`run_model`] for the design:
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! #[test]
//! fn my_store_agrees_with_the_model() {
//!     // Each call: a NEW empty namespace (a new file, table or key prefix).
//!     idem_conformance::run_model(|| async { MemoryStore::new() });
//! }
//! # fn main() {}
//! ```
//!
//! It runs 256 sequences by default; `IDEM_CONFORMANCE_MODEL_CASES=100000` asks for a long run
//! (progress goes to stderr every 5 000 sequences). [`check_model`] returns the failure instead of
//! panicking.
//!
//! # What a store must tolerate
//!
//! - Cases run in parallel against the same storage; each isolates itself with scopes of its own
//!   (`idem-conformance/<case>/<random run id>/…`), never by deleting data, so the storage may be
//!   shared with other data and other runs.
//! - Time comes from a [`ManualClock`](idem_core::ManualClock) passed as `now`: cases move it by
//!   days, and the expiry, purge and inspection cases run it decades in the past (1972–2000), each
//!   purging case in a window of its own, so that their purges cannot touch other cases' records. A
//!   store must decide everything from the `now` it is given, never from its own clock.
//!
//! # What a store must do to pass, case group by case group
//!
//! Case names start with their group, so a failure says where to look. Cases check the records a
//! store leaves, not only its answers, and the executor cases count effects at the sink.
//!
//! - **`claim_`** ([contract §2](idem_core::contract#states), the claim table): each row of the
//!   table, answer and write. An absent key is `Claimed` as attempt 1 and written `processing` with
//!   the fingerprint, token, lease and expiry; a running lease is `InFlight` (with the time left,
//!   never 0) and writes nothing; an elapsed lease is `InFlight { stale: true }` under `Reconcile`
//!   and a takeover (next token, next attempt) under `Takeover`; `completed` replays;
//!   `failed_retryable` is claimed again; any other request for the key is `FingerprintMismatch` in
//!   every state; tokens are unique across keys. To fix a failure: run the decision of
//!   [`idem_core::machine::claim`] on the record as stored, and write its record.
//! - **`fencing_`** ([contract §2](idem_core::contract#states) complete / release / extend, §3.3):
//!   only the holder of the current token acts, and only on a `processing` record. A definitive
//!   outcome completes (expiry renewed to now + ttl); a retryable one is `failed_retryable` under
//!   `DefinitiveOnly` and `completed` under `CacheAll`; a second complete, a stale token after a
//!   takeover, an unknown key are `Fenced` and write nothing; the fingerprint of the claim stays. A
//!   holder whose lease elapsed but whom nobody took over still completes, releases and extends: a
//!   lease ends a claim only by a takeover, so never fence on `lease_until > now` — fence on the
//!   token and the state. `extend` never shortens a lease (the later deadline, and the expiry that
//!   goes with it, is kept and answered) and refuses a lease of zero whole milliseconds with
//!   [`StoreError::ZeroLease`](idem_core::StoreError::ZeroLease), writing nothing.
//! - **`scope_`** ([contract §1](idem_core::contract#words) scope, §3.4): records are addressed by
//!   (scope, key) compared byte for byte. Two addresses that differ only in letter case, in accents
//!   or Unicode normalisation (NFC vs NFD), in trailing spaces, in where a separator falls between
//!   scope and key (`("a:b", "c")` vs `("a", "b:c")`, `/` too), or in the last byte of a 255-byte
//!   key or a 512-byte scope are two independent records: each claims as new, replays its own
//!   outcome, `get` and `list` by scope return each its own. To fix a failure: key the storage by
//!   the two values kept apart (a composite primary key, or a length-prefixed or escaped encoding)
//!   in a binary collation (`COLLATE "C"` or `bytea` in PostgreSQL, `BINARY` in SQLite), never by a
//!   plain concatenation, a lower-cased value, a `CHAR(n)` column or a prefix index.
//! - **`outcome_`** ([contract §3.5](idem_core::contract#guarantee-5)): status, class and body
//!   replay byte for byte (key order, white space, number spelling, Unicode, escapes, a NUL); a
//!   body of exactly the limit is stored; one byte over is refused with `OutcomeTooLarge` before
//!   anything is written.
//! - **`expiry_`** ([contract §2](idem_core::contract#states), §3.6): a record with `expires_at <=
//!   now` is absent to `get`, to `claim` (replaced as attempt 1, token continuing upward) and to
//!   its holder; `now + 1 ms` is live. `purge_expired(now, limit)` deletes expired records only, at
//!   most `limit` per call, and returns exactly how many it deleted (a store that reports fewer
//!   makes `purge_expired_all` stop early); a token is never reused after a purge (random token
//!   ids).
//! - **`inspect_`** ([contract §3.7](idem_core::contract#guarantee-7)): `get` returns the record as
//!   stored; `list_in_flight` the stale `processing` records, earliest lease first, at most
//!   `limit`, never an expired one; `list` filters by state, scope and age, least recently written
//!   first.
//! - **`concurrency_`** ([contract §3.1](idem_core::contract#guarantee-1)): claims from separate
//!   handles released together by a barrier, over several rounds: exactly one wins, for an absent
//!   record, an expired one, a `failed_retryable` one (by outcome and by release) and a stale one
//!   under `Takeover`, and while the holder completes (no claim wins) or releases (exactly one
//!   does); every loser sees the winner's running lease, and the stored record is the winner's. A
//!   takeover racing the old holder's completion, release or extension: one of the two wins, never
//!   both. To fix a failure: the read, the decision and the write of a claim must be one atomic
//!   step for every existing record, not only for an absent key (one transaction that locks the
//!   row — `SELECT … FOR UPDATE`, `BEGIN IMMEDIATE` — or a compare-and-set on every column
//!   another writer can change, or a server-side script). The executor cases count the operation
//!   at the sink: it runs exactly once.
//! - **`checkpoint_`** ([contract §6.1](idem_core::contract#checkpoints), §3.10): a holder's
//!   checkpoints are saved in order, byte for byte; fenced exactly like `complete` (a stale
//!   holder after a takeover, a forged token, a released or completed record: `Fenced`, nothing
//!   written; an elapsed lease nobody took over still saves); kept through a release, a retryable
//!   outcome, a retry and a takeover — also a takeover (a retry's or a reconciler's) racing the
//!   holder's checkpoints from another handle: every checkpoint the holder was told is saved is
//!   on the record it leaves (a compare-and-set that a checkpoint does not change, writing back the
//!   checkpoints it read, loses them); gone after completion, expiry and purge; one over
//!   `max_checkpoint_bytes` is `CheckpointTooLarge` before anything is written. A store whose
//!   `supports_checkpoints()` is false passes them by refusing every checkpoint with
//!   `StoreError::CheckpointsUnsupported`, and is reported as not supporting them.
//! - **`executor_`** ([contract §2](idem_core::contract#states) through [`idem_core::Executor`]):
//!   the same key twice is one effect; a mismatch, an in-flight repeat and a fenced late holder run
//!   or store nothing; an expired record and a retry after a retryable failure run exactly once
//!   more; a slow operation that outlived its lease, with nobody taking over, is recorded and
//!   replays.
//! - **`heartbeat_`** ([contract §2](idem_core::contract#extend) extend,
//!   [§7](idem_core::contract#traps), through [`idem_core::Executor::with_heartbeat`]): a holder
//!   whose work is twice its lease, renewed by the executor's heartbeat every third of it, is
//!   never taken over by a caller under `Takeover` trying at every sixth, its attempt's deadline
//!   is the stored one, and its effect lands once; without heartbeats it is taken over when the
//!   lease ends (two effects); a renewal that comes after a takeover is fenced, and the holder
//!   learns it lost the claim. To fix a failure: `extend` must move `lease_until` to `now +
//!   lease` for the holder of the current token, durably, and answer that deadline.
//! - **`wait_`** ([contract §5.2](idem_core::contract#waiting), through
//!   [`idem_core::Executor::waiting`] and
//!   [`KeyStore::wait_for_change`](idem_core::KeyStore::wait_for_change)): a repeat that waits on
//!   another handle is woken by the completion (it replays), the release (it claims and runs, once)
//!   and a takeover (it waits on the new holder and replays its outcome), each within 5 s; when
//!   nothing happens it answers `InFlight` after its bound, having written nothing. A store that
//!   overrides nothing passes by polling; to fix a failure of an override: subscribe before
//!   reading, notify after every commit that changes the record, from every writer.
//!
//! # The suite can fail
//!
//! Its own tests (`conformance/tests/broken/`) hold deliberately broken stores, one per class of
//! defect: a claim that reads, awaits, then writes (for every record, or only for existing ones);
//! a rewrite whose compare-and-set misses the checkpoints, or compares only the token; no fencing;
//! a lease that fences its own holder; expiry ignored; case-insensitive addressing;
//! `scope + ":" + key` addressing; a purge that miscounts; an extend that writes nothing; a wait
//! that never wakes. Each fails the cases meant to catch it, through [`run_all`],
//! [`run_matching`] and [`conformance_tests!`], and passes a basic case.
//!
//! # What is stable
//!
//! The macro, the functions and types at the crate root, and [`kit`] follow semantic versioning.
//! The suite itself grows: a minor release may add cases (and make a model check stricter), so a
//! store that passed may fail a new case — a defect the suite had not looked for before. A case
//! keeps its name once released. [`failover`] is not a stable API: its knobs and counts follow the
//! failover tests of idem's own stores and may change in a minor release.

pub mod failover;
pub mod kit;

mod cases;
mod harness;
mod model;
mod report;

pub use harness::{Case, StoreFactory};
pub use model::{ModelConfig, ModelFailure, ModelStats, check_model, run_model};
pub use report::{CaseResult, Report, cases, run_all, run_case, run_matching, run_streaming};

/// Generates one `#[test]` per case, running it against the store the factory makes.
///
/// The argument is an expression evaluated once per generated test; its value must implement
/// [`StoreFactory`] (e.g. `|| async { MyStore::connect(..).await.unwrap() }`).
///
/// Outer attributes written before the factory are put on every generated test, e.g. to run the
/// suite only on request:
///
/// ```no_run
/// # use idem_core::MemoryStore;
/// idem_conformance::conformance_tests!(
///     #[ignore = "needs the staging database: cargo test -- --ignored"]
///     || async { MemoryStore::new() }
/// );
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($($input:tt)+) => {
        $crate::__conformance_tests!(() $($input)+);
    };
}

/// Takes the leading attributes one by one (an expression may itself start with an attribute,
/// so `$(#[$attr:meta])* $factory:expr` would be ambiguous), then the factory.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (($($attrs:tt)*) #[$attr:meta] $($rest:tt)+) => {
        $crate::__conformance_tests!(($($attrs)* #[$attr]) $($rest)+);
    };
    (($($attrs:tt)*) $factory:expr $(,)?) => {
        $crate::__case_list!(__emit_tests(($($attrs)*) ($factory)));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_tests {
    (($attrs:tt $factory:tt) $($group:ident :: $case:ident),* $(,)?) => {
        $(
            $crate::__emit_test!($attrs $factory $case);
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_test {
    (($(#[$attr:meta])*) ($factory:expr) $case:ident) => {
        #[test]
        $(#[$attr])*
        fn $case() {
            $crate::run_case(::core::stringify!($case), $factory);
        }
    };
}

/// The table of `cases::ALL`, from [`__case_list!`](crate::__case_list).
macro_rules! __emit_table {
    (() $($group:ident :: $case:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: ::core::stringify!($case),
                group: ::core::stringify!($group),
                run: |h| ::std::boxed::Box::pin($crate::cases::$group::$case(h)),
            },
        )*]
    };
}
pub(crate) use __emit_table;

/// The root README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
