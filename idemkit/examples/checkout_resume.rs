//! A tool with two effects, a payment and then an email, whose holder is killed between them and
//! resumed by a takeover: one payment, one email ([contract §6.1](idemkit::contract#checkpoints)).
//!
//! The tool saves a checkpoint after the payment (`attempt.checkpoint("charged", &payment_id)`).
//! The example starts itself again as a child process that claims the order, pays, saves the
//! checkpoint and is then killed (SIGKILL) before it sends the email. The parent's attempt
//! finds the stale claim, takes it over (time is injected: its clock is past the child's lease)
//! and starts with the checkpoint, so it skips the payment and sends the email. Both effects are
//! rows in tables of the same database, counted at the end: exactly one payment, one email.
//!
//! Runs on SQLite (a temporary file), and on PostgreSQL when `IDEM_TEST_POSTGRES_URL` is set:
//!
//! ```text
//! cargo run -p idemkit --example checkout_resume --features sqlite,postgres
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idemkit::postgres::PostgresStore;
use idemkit::postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idemkit::sqlite::SqliteStore;
use idemkit::sqlite::rusqlite::{Connection, params};
use idemkit::{
    Attempt, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, Outcome, Policy, Scope,
    StalePolicy, Timestamp,
};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease of a checkout: a holder silent for longer may be taken over.
const LEASE: Duration = Duration::from_secs(30);
/// Set in the child process: the store URL, the order, the sink tables' suffix, one line each.
const CHILD_ENV: &str = "IDEM_CHECKOUT_CHILD";
/// What the child prints once it has paid and saved the checkpoint, before it is killed.
const PAID: &str = "IDEM-CHECKOUT-PAID";

/// Where the two effects land: tables in the store's own database, so they can be counted.
#[derive(Clone)]
pub enum Sink {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database; the suffix keeps this run's tables apart.
    Postgres(PgPool, String),
}

impl Sink {
    async fn create(&self) -> Result<(), BoxError> {
        match self {
            Sink::Sqlite(path) => Connection::open(path)?.execute_batch(
                "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, order_id TEXT);
                 CREATE TABLE IF NOT EXISTS emails (order_id TEXT)",
            )?,
            Sink::Postgres(pool, s) => {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE TABLE IF NOT EXISTS payments_{s} (id BIGSERIAL PRIMARY KEY, order_id TEXT);
                     CREATE TABLE IF NOT EXISTS emails_{s} (order_id TEXT)"
                )))
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Charges the order: one payment row; its id.
    async fn pay(&self, order: &str) -> Result<i64, BoxError> {
        Ok(match self {
            Sink::Sqlite(path) => {
                let conn = Connection::open(path)?;
                conn.execute(
                    "INSERT INTO payments (order_id) VALUES (?1)",
                    params![order],
                )?;
                conn.last_insert_rowid()
            }
            Sink::Postgres(pool, s) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "INSERT INTO payments_{s} (order_id) VALUES ($1) RETURNING id"
                )))
                .bind(order)
                .fetch_one(pool)
                .await?
            }
        })
    }

    /// Sends the receipt: one email row.
    async fn email(&self, order: &str) -> Result<(), BoxError> {
        match self {
            Sink::Sqlite(path) => {
                Connection::open(path)?
                    .execute("INSERT INTO emails (order_id) VALUES (?1)", params![order])?;
            }
            Sink::Postgres(pool, s) => {
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO emails_{s} (order_id) VALUES ($1)"
                )))
                .bind(order)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Payments and emails of `order`.
    pub async fn count(&self, order: &str) -> Result<(i64, i64), BoxError> {
        let mut counts = [0; 2];
        for (n, table) in counts.iter_mut().zip(["payments", "emails"]) {
            *n = match self {
                Sink::Sqlite(path) => Connection::open(path)?.query_row(
                    &format!("SELECT count(*) FROM {table} WHERE order_id = ?1"),
                    params![order],
                    |r| r.get(0),
                )?,
                Sink::Postgres(pool, s) => {
                    sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT count(*) FROM {table}_{s} WHERE order_id = $1"
                    )))
                    .bind(order)
                    .fetch_one(pool)
                    .await?
                }
            };
        }
        Ok((counts[0], counts[1]))
    }
}

/// The tool: pay (unless a checkpoint says it was done), save the step, email. With
/// `stop_after_paying`, it announces the payment and waits to be killed instead of emailing. A
/// step that fails answers a retryable outcome: the next attempt runs again, from the checkpoint.
async fn checkout(attempt: Attempt, sink: Sink, order: String, stop_after_paying: bool) -> Outcome {
    let failed = |e: &dyn std::fmt::Display| Outcome::retryable_json(503, e.to_string());
    let payment: i64 = match attempt.checkpoint_value("charged") {
        Ok(Some(payment)) => payment, // an earlier attempt paid: never pay twice
        Ok(None) => {
            let payment = match sink.pay(&order).await {
                Ok(payment) => payment,
                Err(e) => return failed(&e),
            };
            // Fenced like the completion: an error means a newer attempt holds the claim; stop.
            if let Err(e) = attempt.checkpoint("charged", &payment).await {
                return failed(&e);
            }
            payment
        }
        Err(e) => return failed(&e), // not the payment id an earlier attempt saved
    };
    if stop_after_paying {
        println!("{PAID}");
        if let Err(e) = std::io::stdout().flush() {
            return failed(&e);
        }
        // Killed here, between the two effects.
        std::future::pending::<()>().await;
    }
    match sink.email(&order).await {
        Ok(()) => Outcome::definitive_json(200, json!({"order": order, "payment": payment})),
        Err(e) => failed(&e),
    }
}

/// A migrated store and its sink, from a store URL (`sqlite://<path>` or `postgres://…`), and the
/// sink tables' suffix.
async fn open(url: &str, suffix: &str) -> Result<(Arc<dyn KeyStore>, Sink), BoxError> {
    let (store, sink): (Arc<dyn KeyStore>, Sink) = match url.strip_prefix("sqlite://") {
        Some(path) => {
            let store = SqliteStore::open(path)?;
            store.migrate()?;
            (Arc::new(store), Sink::Sqlite(PathBuf::from(path)))
        }
        None => {
            let store = PostgresStore::connect(url).await?;
            store.migrate().await?;
            let pool = store.pool().clone();
            (Arc::new(store), Sink::Postgres(pool, suffix.to_owned()))
        }
    };
    sink.create().await?;
    Ok((store, sink))
}

fn names(order: &str) -> Result<(Scope, IdempotencyKey, Fingerprint), BoxError> {
    Ok((
        Scope::new("shop/checkout")?,
        IdempotencyKey::new(format!("checkout:{order}"))?,
        Fingerprint::of("checkout", &json!({ "order": order }))?,
    ))
}

fn policy() -> Result<Policy, BoxError> {
    Ok(Policy::builder()
        .lease(LEASE)
        .stale(StalePolicy::Takeover)
        .build()?)
}

/// Whether this process is the child that pays and is killed.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The child: claims the order, pays, saves the checkpoint, announces it and waits to be killed.
/// It exits non-zero, saying why, if it cannot get that far.
pub fn child_main() {
    if let Err(e) = child() {
        eprintln!("checkout_resume child: {e}");
        std::process::exit(1);
    }
    unreachable!("the child is killed before it finishes");
}

fn child() -> Result<(), BoxError> {
    let spec = std::env::var(CHILD_ENV)?;
    let lines: Vec<&str> = spec.lines().collect();
    let [url, order, suffix] = lines[..] else {
        return Err(format!("{CHILD_ENV}: three lines, not {spec:?}").into());
    };
    tokio::runtime::Runtime::new()?.block_on(async {
        let (store, sink) = open(url, suffix).await?;
        let executor = Executor::from_arc(store).with_policy(policy()?);
        let (scope, key, fp) = names(order)?;
        let order = order.to_owned();
        executor
            .run(&scope, &key, &fp, |attempt| {
                checkout(attempt, sink, order, true)
            })
            .await?;
        Err("the checkout finished: it should have been killed first".into())
    })
}

/// Runs a checkout in a child process (this executable again, with `child_args` before the
/// child's environment), kills the child between the payment and the email, and resumes the
/// checkout here by a takeover. Returns (payments, emails) of the order at the sinks.
pub async fn kill_and_resume(url: &str, child_args: &[&str]) -> Result<(i64, i64), BoxError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let suffix = format!("{}_{nanos}", std::process::id());
    let order = format!("order-{suffix}");
    let (store, sink) = open(url, &suffix).await?;

    let mut child = Command::new(std::env::current_exe()?)
        .args(child_args)
        .env(CHILD_ENV, format!("{url}\n{order}\n{suffix}"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().ok_or("the child's stdout")?);
    let mut line = String::new();
    while !line.contains(PAID) {
        line.clear();
        assert!(
            out.read_line(&mut line)? > 0,
            "the child died before paying"
        );
    }
    child.kill()?; // SIGKILL: no destructor, no release, the claim stays `processing`
    child.wait()?;
    assert_eq!(sink.count(&order).await?, (1, 0), "paid once, no email yet");

    // Later: past the dead holder's lease (injected time), the retry takes the claim over.
    let clock = ManualClock::new(Timestamp::now() + LEASE + Duration::from_secs(1));
    let executor = Executor::from_arc(store)
        .with_policy(policy()?)
        .with_clock(clock);
    let (scope, key, fp) = names(&order)?;
    let resumed = executor
        .run(&scope, &key, &fp, |attempt| {
            assert_eq!(
                attempt.number(),
                2,
                "a takeover of the killed holder's claim"
            );
            checkout(attempt, sink.clone(), order.clone(), false)
        })
        .await?;
    assert!(!resumed.is_replay());
    // And any further retry replays.
    let again = executor
        .run(&scope, &key, &fp, |_| async { unreachable!("replayed") })
        .await?;
    assert!(again.is_replay());
    sink.count(&order).await
}

fn main() -> Result<(), BoxError> {
    if is_child() {
        child_main();
    }
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("idem-checkout-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sqlite = format!("sqlite://{}", dir.join("checkout.db").display());
    let mut backends = vec![("sqlite", sqlite)];
    match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) => backends.push(("postgres", url)),
        Err(_) => println!("postgres: skipped (IDEM_TEST_POSTGRES_URL is not set)"),
    }
    for (name, url) in backends {
        let (payments, emails) = kill_and_resume(&url, &[]).await?;
        println!(
            "{name}: holder killed between the payment and the email, resumed by a takeover: \
             {payments} payment, {emails} email"
        );
        assert_eq!((payments, emails), (1, 1));
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
