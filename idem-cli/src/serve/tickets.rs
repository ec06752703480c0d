//! Where the reference server keeps its tickets, next to the records: the [`Tickets`] of each
//! engine (one module each), and the [`Backend`] that opens the store and picks them.

use std::sync::Arc;
use std::time::Duration;

use idem_core::reconcile::{Finding, Probe};
use idem_core::{Attempt, KeyStore, Outcome, OutcomeClass, StoreError, Timestamp};
use idemkit::dynamodb::DynamoStore;
use idemkit::postgres::PostgresStore;
use idemkit::redis::RedisStore;
use idemkit::sqlite::SqliteStore;
use idemkit::{OpenOptions, StoreUrl};
use serde_json::json;

use super::BoxError;

mod dynamodb;
mod postgres;
mod redis;
mod sqlite;

use dynamodb::DynamoTickets;
use postgres::PostgresTickets;
use redis::RedisTickets;
use sqlite::SqliteTickets;

/// The database the records and the tickets share: the record store, opened by URL through
/// [`idemkit::open()`], and the tickets kept next to it by the engine's [`Tickets`].
#[derive(Clone)]
pub struct Backend {
    store: Arc<dyn KeyStore>,
    pub(super) tickets: Arc<dyn Tickets>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.store.fmt(f)
    }
}

/// A ticket the tool creates, before it has an id.
#[derive(Clone)]
pub struct NewTicket {
    pub(super) tenant: String,
    pub(super) title: String,
    pub(super) account_id: String,
    pub(super) created_at: String,
}

/// How a tool answers for a new ticket (the ticket, its id): the outcome its record keeps, made
/// inside the ticket's own transaction. The HTTP tool's is [`NewTicket::outcome`]; the MCP
/// tool's is its `CallToolResult`.
pub type Answer = Arc<dyn Fn(&NewTicket, i64) -> Outcome + Send + Sync>;

impl NewTicket {
    /// The ticket of `tenant`, created at `now`.
    pub(super) fn new(tenant: String, title: &str, account_id: &str, now: Timestamp) -> Self {
        let created_at = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(now.as_millis()),
        )
        .to_string();
        Self {
            tenant,
            title: title.to_owned(),
            account_id: account_id.to_owned(),
            created_at,
        }
    }

    /// The ticket's row under `key`, in [`INSERT_TICKET`]'s order.
    pub(super) fn row<'a>(&'a self, key: &'a str) -> [&'a str; 5] {
        [
            &self.tenant,
            &self.title,
            &self.account_id,
            key,
            &self.created_at,
        ]
    }

    /// What the tool answers for the ticket once it has `id`: `ticket_id` and `created_at`.
    pub(super) fn body(&self, id: i64) -> serde_json::Value {
        json!({"ticket_id": format!("T-{id:06}"), "created_at": self.created_at})
    }

    /// The HTTP tool's answer: `201` with [`NewTicket::body`].
    pub(super) fn outcome(&self, id: i64) -> Outcome {
        Outcome::new(201, &self.body(id), OutcomeClass::Definitive).expect("a JSON object")
    }
}

/// What [`Tickets::create`] did.
pub enum Created {
    /// The ticket exists; `recorded` says whether its record was completed with it.
    Ticket {
        /// The ticket's id.
        id: i64,
        /// The tool's answer ([`Answer`]).
        outcome: Outcome,
        /// Whether the record was completed in the ticket's own transaction.
        recorded: bool,
    },
    /// The attempt lost its claim: no ticket was created.
    Fenced,
}

/// Where the reference server keeps its tickets, next to the records: one implementation per
/// engine. A new backend needs one only to run `idem serve` and `idem demo`.
#[idem_core::async_trait]
pub trait Tickets: Send + Sync + 'static {
    /// Creates the tickets table if it is missing.
    async fn create_table(&self) -> Result<(), BoxError>;
    /// How many tickets `tenant` has.
    async fn count(&self, tenant: &str) -> Result<i64, BoxError>;
    /// Keys of `tenant` with more than one ticket.
    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError>;
    /// Inserts a ticket with no record at all (the tool without idem); returns its id.
    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError>;
    /// Inserts the ticket for `attempt` and, where the engine allows, completes the record with
    /// `answer`'s outcome in the same transaction.
    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        answer: Answer,
    ) -> Result<Created, StoreError>;
    /// Where a ticket does not commit with its record, the probe that finds it for the
    /// reconciler (records left `processing` are then reconciled, never taken over); `None`
    /// where they commit together.
    fn probe(&self) -> Option<Box<dyn Probe>>;
}

impl Backend {
    /// Opens the store at `url` (migrating its records table: the server sets up what it
    /// needs) and creates the tickets table.
    pub async fn open(url: &StoreUrl) -> Result<Self, BoxError> {
        let opened = OpenOptions::new().migrate(true).open(url).await?;
        let tickets: Arc<dyn Tickets> = if let Some(s) = opened.engine::<SqliteStore>() {
            Arc::new(SqliteTickets(s.clone()))
        } else if let Some(s) = opened.engine::<PostgresStore>() {
            Arc::new(PostgresTickets(s.clone()))
        } else if let Some(s) = opened.engine::<RedisStore>()
            && !s.is_cluster()
        {
            let conn = idemkit::redis::redis::Client::open(url.expose_secret())?
                .get_connection_manager()
                .await?;
            Arc::new(RedisTickets(conn))
        } else if let Some(s) = opened.engine::<DynamoStore>() {
            Arc::new(DynamoTickets::new(s))
        } else {
            return Err(format!(
                "the reference server keeps its tickets in an SQLite, PostgreSQL, standalone Redis or DynamoDB store, not in {url}"
            )
            .into());
        };
        tickets.create_table().await?;
        Ok(Self {
            store: opened.into_store(),
            tickets,
        })
    }

    /// The record store.
    pub fn store(&self) -> Arc<dyn KeyStore> {
        self.store.clone()
    }

    /// The same backend, its records reached through `store` (a test wraps the store to watch
    /// what the server asks of it).
    #[cfg(test)]
    pub(crate) fn with_store(self, store: Arc<dyn KeyStore>) -> Self {
        Self { store, ..self }
    }

    /// How many tickets `tenant` has: the effects, counted where they land.
    pub async fn ticket_count(&self, tenant: &str) -> Result<i64, BoxError> {
        self.tickets.count(tenant).await
    }

    /// Keys of `tenant` with more than one ticket: double effects, counted at the sink.
    pub async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        self.tickets.double_effects(tenant).await
    }
}

pub(super) const CREATE_TICKETS: &str = "CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    title TEXT NOT NULL,
    account_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    created_at TEXT NOT NULL)";
/// Inserts a ticket ([`NewTicket::row`]) and returns its id (SQLite reads `$n` as `?n`).
pub(super) const INSERT_TICKET: &str = "INSERT INTO tickets (tenant, title, account_id, idempotency_key, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id";
pub(super) const DOUBLE_EFFECTS: &str = "SELECT COUNT(*) FROM (SELECT idempotency_key FROM tickets WHERE tenant = $1 GROUP BY idempotency_key HAVING COUNT(*) > 1) AS d";

/// A [`Tickets::probe`], as the reconciler takes it.
pub(super) struct BoxedProbe(pub(super) Box<dyn Probe>);

#[idem_core::async_trait]
impl Probe for BoxedProbe {
    async fn probe(&self, record: &idem_core::Record) -> Finding {
        self.0.probe(record).await
    }
}
