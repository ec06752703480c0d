//! `idem serve`: the reference tool server.
//!
//! One tool, `POST /tools/create_ticket` (`title`, `account_id` required), behind the
//! [`IdempotencyLayer`]. Each ticket is a row of the table `tickets` in the same database as the
//! records, written in the same transaction as the record's completion: a ticket exists if and
//! only if its record is completed. `GET /tools` describes the tool, with its processing window and
//! the minimum client retry deadline.
//!
//! Who is asking: without tokens ([`ServeOptions::tokens`]) the tenant is the `X-Tenant-Id`
//! header **as sent, unauthenticated**: anyone who can reach the server can act as any tenant and
//! replay its answers, so the header must come from an authenticating proxy in front. With
//! tokens (`--tokens FILE`, see [`crate::tokens`]) a request to the tool must carry
//! `Authorization: Bearer TOKEN` (else 401 `application/problem+json`, nothing runs) and its
//! tenant is the token's; `X-Tenant-Id` is ignored. `GET /tools` (a description) stays open.

use std::sync::Arc;
use std::time::Duration;

use crate::tokens::Tokens;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_core::{
    Attempt, Clock, CompleteAnswer, Executor, KeyStore, Outcome, OutcomeClass, Policy, StoreError,
    SystemClock, Timestamp,
};
use idem_core::{Finding, Probe, Reconciler};
use idem_http::{IdempotencyLayer, Problem};
use idemkit::postgres::{PostgresStore, sqlx};
use idemkit::redis::RedisStore;
use idemkit::redis::redis::{self, AsyncCommands, aio::ConnectionManager};
use idemkit::sqlite::SqliteStore;
use idemkit::sqlite::rusqlite::{self, TransactionBehavior};
use idemkit::{OpenOptions, StoreUrl};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};

/// A boxed error for the binary's setup paths.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header naming the tenant (default `public`).
pub const TENANT_HEADER: &str = "x-tenant-id";

/// What the store write costs at most, added to the processing window for the client deadline.
pub const STORE_WRITE_BUDGET: Duration = Duration::from_millis(500);

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long the tool works before answering (to give it real processing time).
    pub tool_latency: Duration,
    /// The clock (the system clock; tests pass a manual one).
    pub clock: Arc<dyn Clock>,
    /// Honour the demo's fault header ([`DEMO_FAULT_HEADER`]); never on in `idem serve`.
    pub demo_faults: bool,
    /// Bearer tokens mapped to tenants; `None` trusts `X-Tenant-Id` as sent (see the module
    /// docs).
    pub tokens: Option<Arc<Tokens>>,
}

/// With [`ServeOptions::demo_faults`], a request with `x-idem-demo-fault: hang` makes the first
/// attempt of its key hang before its effect, as a holder that crashed mid-flight.
pub const DEMO_FAULT_HEADER: &str = "x-idem-demo-fault";

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tool_latency: Duration::ZERO,
            clock: Arc::new(SystemClock),
            demo_faults: false,
            tokens: None,
        }
    }
}

impl ServeOptions {
    /// The tool's published processing window: its latency plus one second of margin.
    pub fn processing_window(&self) -> Duration {
        self.tool_latency + Duration::from_secs(1)
    }

    /// The minimum client retry deadline: processing window + store write ([contract §5](idem_core::contract#http)). Also the
    /// lease of a claim.
    pub fn min_client_deadline(&self) -> Duration {
        self.processing_window() + STORE_WRITE_BUDGET
    }
}

/// The database the records and the tickets share: the record store, opened by URL through
/// [`idemkit::open()`], and the tickets kept next to it by the engine's [`Tickets`].
#[derive(Clone)]
pub struct Backend {
    store: Arc<dyn KeyStore>,
    tickets: Arc<dyn Tickets>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.store.fmt(f)
    }
}

/// A ticket the tool creates, before it has an id.
pub struct NewTicket {
    tenant: String,
    title: String,
    account_id: String,
    created_at: String,
}

impl NewTicket {
    fn outcome(&self, id: i64) -> Outcome {
        let body = json!({"ticket_id": format!("T-{id:06}"), "created_at": self.created_at});
        Outcome::new(201, &body, OutcomeClass::Definitive).expect("a JSON object")
    }
}

/// What [`Tickets::create`] did.
pub enum Created {
    /// The ticket exists; `recorded` says whether its record was completed with it.
    Ticket {
        /// The tool's answer.
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
    /// Inserts the ticket for `attempt` and, where the engine allows, completes the record in
    /// the same transaction.
    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        policy: Policy,
        now: Timestamp,
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
        } else {
            return Err(format!(
                "the reference server keeps its tickets in an SQLite, PostgreSQL or standalone Redis store, not in {url}"
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

    /// How many tickets `tenant` has: the effects, counted where they land.
    pub async fn ticket_count(&self, tenant: &str) -> Result<i64, BoxError> {
        self.tickets.count(tenant).await
    }

    /// Keys of `tenant` with more than one ticket: double effects, counted at the sink.
    pub async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        self.tickets.double_effects(tenant).await
    }
}

const CREATE_TICKETS: &str = "CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    title TEXT NOT NULL,
    account_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    created_at TEXT NOT NULL)";
const DOUBLE_EFFECTS: &str = "SELECT COUNT(*) FROM (SELECT idempotency_key FROM tickets WHERE tenant = $1 GROUP BY idempotency_key HAVING COUNT(*) > 1) AS d";

/// Tickets in the SQLite file, inserted in the transaction that completes the record.
struct SqliteTickets(SqliteStore);

#[idem_core::async_trait]
impl Tickets for SqliteTickets {
    async fn create_table(&self) -> Result<(), BoxError> {
        self.0
            .with_connection(|c| c.execute_batch(CREATE_TICKETS))
            .await??;
        Ok(())
    }

    async fn count(&self, tenant: &str) -> Result<i64, BoxError> {
        let tenant = tenant.to_owned();
        Ok(self
            .0
            .with_connection(move |c| {
                c.query_row(
                    "SELECT COUNT(*) FROM tickets WHERE tenant = ?1",
                    [tenant],
                    |r| r.get(0),
                )
            })
            .await??)
    }

    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        let tenant = tenant.to_owned();
        Ok(self
            .0
            .with_connection(move |c| {
                c.query_row(&DOUBLE_EFFECTS.replace("$1", "?1"), [tenant], |r| r.get(0))
            })
            .await??)
    }

    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError> {
        let fields = [
            ticket.tenant.clone(),
            ticket.title.clone(),
            ticket.account_id.clone(),
            key.to_owned(),
            ticket.created_at.clone(),
        ];
        Ok(self
            .0
            .with_connection(move |c| {
                c.execute(
                    "INSERT INTO tickets (tenant, title, account_id, idempotency_key, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    fields,
                )?;
                Ok::<_, rusqlite::Error>(c.last_insert_rowid())
            })
            .await??)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        _policy: Policy,
        _now: Timestamp,
    ) -> Result<Created, StoreError> {
        let (key, attempt) = (attempt.key().clone(), attempt.clone());
        let store = self.0.clone();
        self.0
            .with_connection(move |conn| {
                let db = |e: rusqlite::Error| StoreError::backend("sqlite: tickets", e);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(db)?;
                tx.execute(
                    "INSERT INTO tickets (tenant, title, account_id, idempotency_key, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    [&ticket.tenant, &ticket.title, &ticket.account_id, key.as_str(), &ticket.created_at],
                )
                .map_err(db)?;
                let outcome = ticket.outcome(tx.last_insert_rowid());
                match store.complete_in(&tx, &attempt, &outcome)? {
                    CompleteAnswer::Fenced => Ok(Created::Fenced), // dropped: rolled back
                    _ => {
                        tx.commit().map_err(db)?;
                        Ok(Created::Ticket {
                            outcome,
                            recorded: true,
                        })
                    }
                }
            })
            .await?
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        None
    }
}

/// Tickets in the PostgreSQL database, inserted in the transaction that completes the record.
struct PostgresTickets(PostgresStore);

#[idem_core::async_trait]
impl Tickets for PostgresTickets {
    async fn create_table(&self) -> Result<(), BoxError> {
        // A constant with a constant rewritten into it: no input reaches this text.
        sqlx::query(sqlx::AssertSqlSafe(CREATE_TICKETS.replace(
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "BIGSERIAL PRIMARY KEY",
        )))
        .execute(self.0.pool())
        .await?;
        Ok(())
    }

    async fn count(&self, tenant: &str) -> Result<i64, BoxError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM tickets WHERE tenant = $1")
                .bind(tenant)
                .fetch_one(self.0.pool())
                .await?,
        )
    }

    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        Ok(sqlx::query_scalar(DOUBLE_EFFECTS)
            .bind(tenant)
            .fetch_one(self.0.pool())
            .await?)
    }

    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError> {
        Ok(sqlx::query_scalar(
            "INSERT INTO tickets (tenant, title, account_id, idempotency_key, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(&ticket.tenant)
        .bind(&ticket.title)
        .bind(&ticket.account_id)
        .bind(key)
        .bind(&ticket.created_at)
        .fetch_one(self.0.pool())
        .await?)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        _policy: Policy,
        _now: Timestamp,
    ) -> Result<Created, StoreError> {
        let key = attempt.key();
        let db = |e: sqlx::Error| StoreError::backend("postgres: tickets", e);
        let mut tx = self.0.pool().begin().await.map_err(db)?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO tickets (tenant, title, account_id, idempotency_key, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(&ticket.tenant)
        .bind(&ticket.title)
        .bind(&ticket.account_id)
        .bind(key.as_str())
        .bind(&ticket.created_at)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let outcome = ticket.outcome(id);
        match self.0.complete_in(&mut tx, attempt, &outcome).await? {
            CompleteAnswer::Fenced => {
                tx.rollback().await.map_err(db)?;
                Ok(Created::Fenced)
            }
            _ => {
                tx.commit().await.map_err(db)?;
                Ok(Created::Ticket {
                    outcome,
                    recorded: true,
                })
            }
        }
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        None
    }
}

/// Where a Redis backend keeps tickets: per tenant, the list of the keys of its tickets (one
/// entry per ticket, so duplicates show), and the ticket of each (scope, key) for the probe.
fn redis_tickets_key(tenant: &str) -> String {
    format!("idem-demo:tickets:{{{tenant}}}")
}

const REDIS_TICKET_OF: &str = "idem-demo:ticket-of";

fn redis_ticket_field(scope: &idem_core::Scope, key: &str) -> String {
    format!("{}\n{key}", scope.as_str())
}

/// Tickets on a standalone Redis server. They cannot share a transaction with the record: the
/// ticket is written, then the layer completes the record; a holder that dies in between
/// leaves a `processing` record that the reconciler settles by looking the ticket up.
struct RedisTickets(ConnectionManager);

#[idem_core::async_trait]
impl Tickets for RedisTickets {
    async fn create_table(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn count(&self, tenant: &str) -> Result<i64, BoxError> {
        Ok(self.0.clone().llen(redis_tickets_key(tenant)).await?)
    }

    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        let keys: Vec<String> = self
            .0
            .clone()
            .lrange(redis_tickets_key(tenant), 0, -1)
            .await?;
        let mut counts = std::collections::HashMap::new();
        for key in keys {
            *counts.entry(key).or_insert(0) += 1;
        }
        Ok(counts.values().filter(|n| **n > 1).count() as i64)
    }

    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError> {
        let mut conn = self.0.clone();
        let id: i64 = conn.incr("idem-demo:ticket-seq", 1).await?;
        let _: () = conn.rpush(redis_tickets_key(&ticket.tenant), key).await?;
        Ok(id)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        _policy: Policy,
        _now: Timestamp,
    ) -> Result<Created, StoreError> {
        let db = |e: redis::RedisError| StoreError::unavailable("redis: tickets", e);
        let mut conn = self.0.clone();
        let id: i64 = conn.incr("idem-demo:ticket-seq", 1).await.map_err(db)?;
        let outcome = ticket.outcome(id);
        let _: () = redis::pipe()
            .atomic()
            .rpush(redis_tickets_key(&ticket.tenant), attempt.key().as_str())
            .hset(
                REDIS_TICKET_OF,
                redis_ticket_field(attempt.scope(), attempt.key().as_str()),
                outcome.body(),
            )
            .query_async(&mut conn)
            .await
            .map_err(db)?;
        // Not recorded: the layer completes the record after this answer.
        Ok(Created::Ticket {
            outcome,
            recorded: false,
        })
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(RedisTicketProbe(self.0.clone())))
    }
}

/// A [`Tickets::probe`], as the reconciler takes it.
struct BoxedProbe(Box<dyn Probe>);

#[idem_core::async_trait]
impl Probe for BoxedProbe {
    async fn probe(&self, record: &idem_core::Record) -> Finding {
        self.0.probe(record).await
    }
}

/// The reconciler's probe on a Redis backend: is there a ticket for this (scope, key)?
struct RedisTicketProbe(ConnectionManager);

#[idem_core::async_trait]
impl Probe for RedisTicketProbe {
    async fn probe(&self, record: &idem_core::Record) -> Finding {
        let mut conn = self.0.clone();
        let found: Result<Option<String>, _> = conn
            .hget(
                REDIS_TICKET_OF,
                redis_ticket_field(&record.scope, record.key.as_str()),
            )
            .await;
        match found {
            Ok(Some(body)) => Outcome::from_json_text(201, body, OutcomeClass::Definitive)
                .map_or(Finding::Unknown, Finding::Happened),
            Ok(None) => Finding::NotHappened,
            Err(_) => Finding::Unknown,
        }
    }
}

struct AppState {
    backend: Backend,
    options: ServeOptions,
    policy: Policy,
    /// Keys whose first unprotected request was hung (demo faults without idem).
    hung: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The tool's description, as `GET /tools` lists it.
pub fn tools(options: &ServeOptions) -> Value {
    let window = options.processing_window().as_millis() as u64;
    let deadline = options.min_client_deadline().as_millis() as u64;
    json!({"tools": [{
        "name": "create_ticket",
        "description": format!(
            "Creates a support ticket. Side-effecting: send an Idempotency-Key header made from your \
             durable workflow step and reuse it on every retry. Processing window: {window} ms; \
             minimum client retry deadline: {deadline} ms — a client attempt shorter than that is \
             cut off while the tool is still working."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1},
                "account_id": {"type": "string", "minLength": 1}
            },
            "required": ["title", "account_id"],
            "additionalProperties": false
        },
        "processing_window_ms": window,
        "min_client_deadline_ms": deadline,
    }]})
}

/// The server's router on `backend`.
pub fn router(backend: Backend, options: ServeOptions) -> Router {
    // On SQL stores, Takeover is safe, and only because the ticket and the completion commit
    // together: a record still `processing` after its lease means its holder never committed, so
    // no ticket exists, and a late holder is fenced inside its own transaction (which then rolls
    // back). On Redis the ticket is written before the record is completed, so a stale record
    // is left to the reconciler, which looks the ticket up.
    let probe = backend.tickets.probe();
    let stale = match probe {
        Some(_) => idem_core::StalePolicy::Reconcile,
        None => idem_core::StalePolicy::Takeover,
    };
    let policy = Policy::builder()
        .lease(options.min_client_deadline())
        .stale(stale)
        .build()
        .expect("a lease under the default ttl");
    if let Some(probe) = probe {
        let reconciler = Reconciler::new(
            backend.store(),
            options.clock.clone(),
            policy,
            BoxedProbe(probe),
        );
        let every = policy.lease() / 2;
        tokio::spawn(async move { reconciler.run_periodically(every, tokio::time::sleep).await });
    }
    let executor = Executor::from_arc(backend.store())
        .with_policy(policy)
        .with_clock(options.clock.clone())
        .with_spawner(|task| {
            tokio::spawn(task);
        });
    // The tenant `authenticate` put in the request: from the token, or the header as sent.
    let layer = IdempotencyLayer::new(executor, |parts| {
        parts
            .extensions
            .get::<Tenant>()
            .map(|t| t.0.clone())
            .ok_or_else(|| Problem::Unauthenticated("no tenant for the request".into()))
    });
    let tokens = options.tokens.clone();
    let listing = tools(&options);
    let state = Arc::new(AppState {
        backend,
        options,
        policy,
        hung: Default::default(),
    });
    Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
        .route_layer(axum::middleware::from_fn_with_state(tokens, authenticate))
        .route("/tools", get(move || async move { Json(listing) }))
        .with_state(state)
}

/// The tenant of a request, as [`authenticate`] established it.
#[derive(Debug, Clone)]
struct Tenant(String);

/// Puts the request's [`Tenant`] in its extensions: with tokens, the tenant of its
/// `Authorization: Bearer` token (else 401, and the request goes no further); without, the
/// `X-Tenant-Id` header as sent.
async fn authenticate(
    State(tokens): State<Option<Arc<Tokens>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let tenant = match &tokens {
        None => tenant(request.headers()),
        Some(tokens) => {
            let value = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            match tokens.tenant_of_header(value) {
                Some(tenant) => tenant.to_owned(),
                None => {
                    let mut refused: Response = Problem::Unauthenticated(
                        "send Authorization: Bearer TOKEN with a token this server knows".into(),
                    )
                    .to_response();
                    refused.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        axum::http::HeaderValue::from_static("Bearer realm=\"idem\""),
                    );
                    return refused;
                }
            }
        }
    };
    request.extensions_mut().insert(Tenant(tenant));
    next.run(request).await
}

/// The same tool without the idempotency layer (for `idem demo --without-idem`): every request
/// that reaches it creates a ticket. Like the layered tool, the work runs in its own task, so a
/// client that gives up does not stop a ticket that is being created.
pub fn router_without_idem(backend: Backend, options: ServeOptions) -> Router {
    let listing = tools(&options);
    let state = Arc::new(AppState {
        backend,
        options,
        policy: Policy::default(),
        hung: Default::default(),
    });
    Router::new()
        .route("/tools/create_ticket", post(create_ticket_unprotected))
        .route("/tools", get(move || async move { Json(listing) }))
        .with_state(state)
}

async fn create_ticket_unprotected(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Response {
    let work = tokio::spawn(async move {
        let field = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let (Some(title), Some(account_id)) = (field("title"), field("account_id")) else {
            return (StatusCode::UNPROCESSABLE_ENTITY, "{}".to_owned());
        };
        if app.options.demo_faults && headers.get(DEMO_FAULT_HEADER).is_some_and(|v| v == "hang") {
            // Without a record there is no "first attempt": hang the first request of the key.
            let first = app
                .hung
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key_of(&headers));
            if first {
                std::future::pending::<()>().await;
            }
        }
        if !app.options.tool_latency.is_zero() {
            tokio::time::sleep(app.options.tool_latency).await;
        }
        let ticket = NewTicket {
            tenant: tenant(&headers),
            title: title.to_owned(),
            account_id: account_id.to_owned(),
            created_at: rfc3339(app.options.clock.now()),
        };
        match app.backend.tickets.insert(&key_of(&headers), &ticket).await {
            Ok(id) => (StatusCode::CREATED, ticket.outcome(id).body().to_owned()),
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": e.to_string()}).to_string(),
            ),
        }
    });
    match work.await {
        Ok((status, body)) => {
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The key as the layer read it (a structured-field string is unquoted, as the client sends it).
fn key_of(headers: &HeaderMap) -> String {
    idem_http::read_key(headers)
        .map(|key| key.as_str().to_owned())
        .unwrap_or_default()
}

fn rfc3339(now: Timestamp) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(now.as_millis()))
        .to_string()
}

fn tenant(headers: &HeaderMap) -> String {
    headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .unwrap_or("public")
        .to_owned()
}

async fn create_ticket(
    State(app): State<Arc<AppState>>,
    Extension(attempt): Extension<Attempt>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Response {
    let field = |name: &str| {
        args.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let (Some(title), Some(account_id)) = (field("title"), field("account_id")) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "title and account_id are required, non-empty strings"})),
        )
            .into_response();
    };
    if app.options.demo_faults
        && attempt.number() == 1
        && headers.get(DEMO_FAULT_HEADER).is_some_and(|v| v == "hang")
    {
        // A holder that crashed mid-flight: it never commits and never answers.
        std::future::pending::<()>().await;
    }
    if !app.options.tool_latency.is_zero() {
        tokio::time::sleep(app.options.tool_latency).await;
    }
    let now = app.options.clock.now();
    let ticket = NewTicket {
        tenant,
        title: title.to_owned(),
        account_id: account_id.to_owned(),
        created_at: rfc3339(now),
    };
    match app
        .backend
        .tickets
        .create(&attempt, ticket, app.policy, now)
        .await
    {
        Ok(Created::Ticket { outcome, recorded }) => {
            if recorded {
                attempt.mark_recorded();
            }
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                outcome.body().to_owned(),
            )
                .into_response()
        }
        Ok(Created::Fenced) => (
            StatusCode::CONFLICT,
            Json(json!({"error": "this attempt lost its claim; no ticket was created"})),
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "ticket not created");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "the ticket could not be stored; no ticket was created"})),
            )
                .into_response()
        }
    }
}

/// Installs the Prometheus recorder process-wide ([`metrics-exporter-prometheus`]) and
/// describes every idem metric ([`idem_core::metrics::describe`]); fails if a recorder is
/// already installed. Histograms are exported as summaries; a background task runs the
/// exporter's upkeep every few seconds.
///
/// [`metrics-exporter-prometheus`]: https://docs.rs/metrics-exporter-prometheus
pub fn install_metrics() -> Result<PrometheusHandle, BoxError> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    idem_core::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `GET /metrics`: the Prometheus text exposition of `handle`'s recorder (for
/// `idem serve --metrics ADDR`, on a listener of its own).
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
        }),
    )
}
