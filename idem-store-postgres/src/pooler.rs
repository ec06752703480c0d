//! Recognising a transaction pooler (PgBouncer `pool_mode = transaction`, and managed poolers
//! that behave like it) without being told ([contract §7](idem_core::contract#traps)): a probe
//! before the first statement, and a prepared-statement collision after it.
//!
//! - The probe: two connections of their own (outside the store's pool). The first reads its
//!   server process (`pg_backend_pid()`); the second opens a transaction and reads its own; the
//!   first reads again. On a direct connection (or through session pooling) a client connection
//!   keeps one server process for its life and two open connections never share one; behind a
//!   transaction pooler the second is handed the server connection the first just gave back (a
//!   pooler reuses the last one released first), or the first is handed another. Either sighting
//!   proves transaction pooling; none in [`ROUNDS`] rounds is taken as a direct connection. Only
//!   simple-protocol queries, so the probe leaves no prepared statement behind. The answer is
//!   kept per address (host or socket, port, user, database) for the life of the process: the
//!   stores of one process probe each server once.
//! - A pooler that refuses the `extra_float_digits` startup parameter (PgBouncer unless
//!   `ignore_startup_parameters` names it) answers SQLSTATE 08P01 before any query: the probe
//!   connects again without it, and the pool's new connections leave it out from then on.
//! - The collision: a statement that ran prepared and failed with SQLSTATE 26000 (prepared
//!   statement missing) or 42P05 (already there), or 08P01 (a `Bind` that does not fit the
//!   statement of that name), failed before it ran, so it changed nothing: the store switches to
//!   inline statements for good and runs it once more.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::OnceCell;

use crate::error::sqlstate;

/// How many times the probe looks for a server process changing hands.
const ROUNDS: usize = 3;

/// How the store sends its statements: prepared (cached per connection) or inline (one
/// simple-protocol query each, for a transaction pooler).
#[derive(Debug, Default)]
pub(crate) struct Mode {
    /// Set once the mode is known: told (the URL's `pooler`,
    /// `PostgresStore::with_transaction_pooler`) or found by the probe.
    decided: OnceCell<()>,
    /// Statements go inline. Once set, never cleared.
    inline: AtomicBool,
}

impl Mode {
    /// A mode already known (told, or probed by `PostgresStore::connect`): no probe.
    pub(crate) fn known(inline: bool) -> Self {
        Self {
            decided: OnceCell::new_with(Some(())),
            inline: AtomicBool::new(inline),
        }
    }

    /// Whether statements go inline now: behind a transaction pooler, and while the mode is not
    /// known (inline statements work everywhere).
    pub(crate) fn inline(&self) -> bool {
        self.inline.load(Ordering::SeqCst) || !self.decided.initialized()
    }

    /// Probes with `probe` once, unless the mode is known: `probe` answers whether a transaction
    /// pooler is in the path. A probe that fails (the server unreachable, connections killed)
    /// leaves the mode unknown, so the store sends inline until a later probe succeeds.
    pub(crate) async fn decide<F, Fut>(&self, probe: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<bool, ProbeError>>,
    {
        let decided = self
            .decided
            .get_or_try_init(|| async {
                if probe().await? {
                    self.switch();
                }
                Ok::<_, ProbeError>(())
            })
            .await;
        if let Err(error) = decided {
            tracing::debug!(
                ?error,
                "postgres: the pooler check failed; statements go inline until it succeeds"
            );
        }
    }

    /// After `err` from a statement built while the mode was `ran_inline`: whether it was a
    /// prepared-statement collision, the store now sends statements inline, and the statement
    /// (which changed nothing) may run once more.
    pub(crate) fn collided(&self, ran_inline: bool, err: &sqlx::Error) -> bool {
        if ran_inline || !is_collision(err) {
            return false;
        }
        if !self.inline.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                error = %err,
                "postgres: a transaction pooler is in the path (prepared statements collided); \
                 statements are sent inline from now on"
            );
        }
        true
    }

    fn switch(&self) {
        self.inline.store(true, Ordering::SeqCst);
        tracing::info!("postgres: a transaction pooler is in the path; statements are sent inline");
    }
}

/// What a transaction pooler answers a client whose prepared statement was made on another server
/// connection: missing (26000), already there (42P05), or a `Bind` that does not fit the statement
/// of that name there (08P01). The statement did not run.
pub(crate) fn is_collision(err: &sqlx::Error) -> bool {
    matches!(sqlstate(err).as_deref(), Some("26000" | "42P05" | "08P01"))
}

/// What the probe found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probed {
    /// Whether a transaction pooler is in the path.
    pub(crate) transaction_pooler: bool,
    /// Whether the server refused the `extra_float_digits` startup parameter (the probe
    /// connected without it).
    pub(crate) refused_extra_float_digits: bool,
}

/// Why the probe failed.
#[derive(Debug)]
pub(crate) enum ProbeError {
    /// The server could not be reached or answered with an error.
    Sql(sqlx::Error),
    /// A server that answered a query refused a transaction with 08P01: a pooler in statement
    /// mode (PgBouncer `pool_mode = statement`), where `migrate` and `complete_in` cannot work.
    NoTransactions(sqlx::Error),
}

impl From<sqlx::Error> for ProbeError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

/// Where a connection goes: host (or socket) and port, user, database.
type Address = (String, Option<PathBuf>, u16, String, Option<String>);

/// What the probes of this process found, by address.
static FOUND: Mutex<Vec<(Address, Probed)>> = Mutex::new(Vec::new());

fn address(options: &PgConnectOptions) -> Address {
    (
        options.get_host().to_owned(),
        options.get_socket().cloned(),
        options.get_port(),
        options.get_username().to_owned(),
        options.get_database().map(str::to_owned),
    )
}

/// What the probe of the server `options` connect to finds: asked once per address and process,
/// for at most `limit` (a server that accepts connections and never answers, as the pool's
/// acquire timeout bounds a statement's wait).
pub(crate) async fn probe_once(
    options: &PgConnectOptions,
    limit: Duration,
) -> Result<Probed, ProbeError> {
    let address = address(options);
    let found = |list: &Vec<(Address, Probed)>| {
        list.iter()
            .find(|(known, _)| *known == address)
            .map(|(_, probed)| *probed)
    };
    if let Some(probed) = found(&FOUND.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(probed);
    }
    let probed = tokio::time::timeout(limit, probe(options))
        .await
        .map_err(|_| ProbeError::Sql(sqlx::Error::PoolTimedOut))??;
    let mut list = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if found(&list).is_none() {
        list.push((address, probed));
    }
    Ok(probed)
}

/// Probes the server `options` connect to (see the module docs).
async fn probe(options: &PgConnectOptions) -> Result<Probed, ProbeError> {
    let (mut first, refused) = connect(options).await?;
    let options = if refused {
        options.clone().extra_float_digits(None)
    } else {
        options.clone()
    };
    let found = async {
        let mut second = PgConnection::connect_with(&options).await?;
        let found = rounds(&mut first, &mut second).await;
        let _ = second.close().await;
        found
    }
    .await;
    let _ = first.close().await;
    Ok(Probed {
        transaction_pooler: found?,
        refused_extra_float_digits: refused,
    })
}

/// A connection with `options`, or, if the server refuses a startup parameter (08P01, before
/// any query), without `extra_float_digits` (then `true`).
async fn connect(options: &PgConnectOptions) -> Result<(PgConnection, bool), sqlx::Error> {
    match PgConnection::connect_with(options).await {
        Ok(c) => Ok((c, false)),
        Err(refused) if sqlstate(&refused).as_deref() == Some("08P01") => {
            let without = options.clone().extra_float_digits(None);
            match PgConnection::connect_with(&without).await {
                Ok(c) => Ok((c, true)),
                Err(_) => Err(refused),
            }
        }
        Err(e) => Err(e),
    }
}

/// The server process behind `conn` for `sql` (a simple query whose one row is
/// `pg_backend_pid()`).
async fn backend(conn: &mut PgConnection, sql: &'static str) -> Result<i32, sqlx::Error> {
    sqlx::raw_sql(sql).fetch_one(conn).await?.try_get(0)
}

/// Whether a server process changed hands between `first` and `second` (see the module docs).
async fn rounds(first: &mut PgConnection, second: &mut PgConnection) -> Result<bool, ProbeError> {
    let mine = backend(first, "SELECT pg_backend_pid()").await?;
    for _ in 0..ROUNDS {
        // Held in a transaction: a pooler cannot hand it to `first` meanwhile.
        let theirs = match backend(second, "BEGIN; SELECT pg_backend_pid()").await {
            Ok(pid) => pid,
            Err(e) if sqlstate(&e).as_deref() == Some("08P01") => {
                return Err(ProbeError::NoTransactions(e));
            }
            Err(e) => return Err(e.into()),
        };
        let again = backend(first, "SELECT pg_backend_pid()").await;
        sqlx::raw_sql("ROLLBACK").execute(&mut *second).await?;
        if theirs == mine || again? != mine {
            return Ok(true);
        }
    }
    Ok(false)
}
