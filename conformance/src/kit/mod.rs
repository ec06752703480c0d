//! What the tests of a store (and of anything built on one) share: the servers they are told
//! about, names no other test uses, temporary directories, and [`FaultStore`], a store that
//! forwards to yours and fails, waits or meddles when told to.
//! Plain functions and one type, for your own store's tests as much as for idem's.
//!
//! # Servers from the environment
//!
//! A test that needs a server reads its URL at run time with [`env_url`] (or a named helper such
//! as [`postgres_url`]): set, the URL; unset outside `CI`, the test says why on stderr and gets
//! `None` (it skips); unset under `CI` (any value of the `CI` variable), the test panics, because
//! there a missing server is a failure, not a skip.
//!
//! ```no_run
//! #[test]
//! fn talks_to_postgres() {
//!     let Some(url) = idem_conformance::kit::postgres_url() else {
//!         return; // skipped, and stderr says why
//!     };
//!     // … connect to `url` …
//! }
//! # fn main() {}
//! ```
//!
//! # Faults
//!
//! ```
//! use idem_conformance::kit::{Fault, FaultStore, Op};
//! use idem_core::{Executor, MemoryStore};
//!
//! let store = FaultStore::new(MemoryStore::new());
//! store.fail_next(Op::Claim, 1, Fault::Unavailable); // the next claim: store down
//! let executor = Executor::new(store.clone()); // clones share their faults and counts
//! // … run the executor; then count what reached the store:
//! assert_eq!(store.calls(Op::Complete), 0);
//! ```

mod fault;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

pub use fault::{Call, Fault, FaultStore, Op};

/// The value of the environment variable `name`, or `None` after saying on stderr why the test
/// skips (`hint`: how to get the variable set). Under `CI` a missing (or blank) variable panics
/// instead: there a missing server is a failure.
pub fn env_url(name: &str, hint: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            skip(format_args!("{name} is not set ({hint})"));
            None
        }
    }
}

/// [`env_url`] for a comma-separated list of URLs (blank entries dropped).
pub fn env_urls(name: &str, hint: &str) -> Option<Vec<String>> {
    env_url(name, hint).map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// Says on stderr why a test skips (`what` is missing); under `CI` panics with it instead.
pub fn skip(what: impl fmt::Display) {
    if std::env::var_os("CI").is_some() {
        panic!("{what}: under CI a missing server is a failure");
    }
    eprintln!("skipping: {what}");
}

/// `IDEM_TEST_POSTGRES_URL`, e.g. `postgres://postgres@127.0.0.1:5432/test` ([`env_url`]).
pub fn postgres_url() -> Option<String> {
    env_url(
        "IDEM_TEST_POSTGRES_URL",
        "e.g. postgres://postgres@127.0.0.1:5432/test; idem's scripts/test sets it",
    )
}

/// `IDEM_TEST_PGBOUNCER_URL`, the test database through PgBouncer in transaction pooling mode
/// ([`env_url`]).
pub fn pgbouncer_url() -> Option<String> {
    env_url(
        "IDEM_TEST_PGBOUNCER_URL",
        "e.g. postgres://postgres@127.0.0.1:56432/test; idem's scripts/services/pgbouncer.sh starts one",
    )
}

/// `IDEM_TEST_REDIS_URL`, a standalone Redis, e.g. `redis://127.0.0.1:6379` ([`env_url`]).
pub fn redis_url() -> Option<String> {
    env_url(
        "IDEM_TEST_REDIS_URL",
        "e.g. redis://127.0.0.1:6379; idem's scripts/test sets it",
    )
}

/// A name no other test, process or run uses: `prefix`, the process id, a counter of this
/// process and the time in nanoseconds, joined by `-` (replace them for an SQL identifier).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The first error of type `E` among `err`'s sources (not `err` itself), looking inside the
/// `std::io::Error`s on the way too (an `io::Error`'s `source()` skips the error it wraps, and
/// TLS libraries' errors often arrive wrapped in one).
pub fn find_source<'a, E: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<E>())
        {
            return Some(inner);
        }
        source = e.source();
    }
    None
}

/// A loopback TCP port that was free a moment ago, for a server the test starts itself.
///
/// # Panics
///
/// If no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// A temporary directory, removed (with everything in it) when dropped: `tempfile`'s.
pub use tempfile::TempDir;

/// A new directory of its own under the system's temporary directory, named after `prefix`;
/// removed when the [`TempDir`] drops.
///
/// # Panics
///
/// If the directory cannot be created.
pub fn temp_dir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .tempdir()
        .expect("create a temporary directory")
}

/// The store URL of a test of `backend`: a file `file` in a fresh [`TempDir`] for `"sqlite"`
/// (returned too: the file goes when it drops), [`postgres_url`] for `"postgres"`, [`redis_url`]
/// for `"redis"`, `IDEM_TEST_DYNAMODB_URL` for `"dynamodb"`; `None` when the server's variable is
/// unset outside `CI` (the test skips).
///
/// # Panics
///
/// On any other `backend`, and (from [`env_url`]) under `CI` without the variable.
pub fn store_url(backend: &str, file: &str) -> Option<(String, Option<TempDir>)> {
    match backend {
        "sqlite" => {
            let dir = temp_dir(&format!("idem-{file}"));
            let url = format!("sqlite://{}", dir.path().join(file).display());
            Some((url, Some(dir)))
        }
        "postgres" => Some((postgres_url()?, None)),
        // The same database through PgBouncer in transaction mode, its plain URL as a user has it
        // (the store finds the pooler itself); waits poll (no `listen_url`).
        "postgres-pooler" => Some((pgbouncer_url()?, None)),
        "redis" => Some((redis_url()?, None)),
        "dynamodb" => Some((
            env_url(
                "IDEM_TEST_DYNAMODB_URL",
                "scripts/services/dynamodb.sh starts a local DynamoDB-compatible server (moto)",
            )?,
            None,
        )),
        other => panic!("no test store for backend {other:?}"),
    }
}
