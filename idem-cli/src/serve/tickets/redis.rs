//! Tickets on a standalone Redis server, found by the reconciler's probe.

use idem_core::reconcile::{Finding, Probe};
use idem_core::{Attempt, Outcome, OutcomeClass, StoreError};
use idemkit::redis::redis::{self, AsyncCommands, aio::ConnectionManager};

use super::{Answer, BoxError, Created, NewTicket, Tickets};

/// Where a Redis backend keeps tickets: per tenant, the list of the keys of its tickets (one
/// entry per ticket, so duplicates show), and the ticket of each (scope, key) for the probe.
fn redis_tickets_key(tenant: &str) -> String {
    format!("idem-demo:tickets:{{{tenant}}}")
}

const REDIS_TICKET_OF: &str = "idem-demo:ticket-of";

fn redis_ticket_field(scope: &idem_core::Scope, key: &str) -> String {
    format!("{}\n{key}", scope.as_str())
}

/// The outcome the probe finds for a ticket: its status, a space, its body (the HTTP tool's
/// and the MCP tool's differ in both).
fn stored_outcome(outcome: &Outcome) -> String {
    format!("{} {}", outcome.status(), outcome.body())
}

/// Reads [`stored_outcome`]'s text back; `None` if it is not one.
fn read_stored_outcome(text: &str) -> Option<Outcome> {
    let (status, body) = text.split_once(' ')?;
    Outcome::from_json_text(status.parse().ok()?, body, OutcomeClass::Definitive).ok()
}

/// Tickets on a standalone Redis server. They cannot share a transaction with the record: the
/// ticket is written, then the layer completes the record; a holder that dies in between
/// leaves a `processing` record that the reconciler settles by looking the ticket up.
pub(super) struct RedisTickets(pub(super) ConnectionManager);

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
        answer: Answer,
    ) -> Result<Created, StoreError> {
        let db = |e: redis::RedisError| StoreError::unavailable("redis: tickets", e);
        let mut conn = self.0.clone();
        let id: i64 = conn.incr("idem-demo:ticket-seq", 1).await.map_err(db)?;
        let outcome = answer(&ticket, id);
        let _: () = redis::pipe()
            .atomic()
            .rpush(redis_tickets_key(&ticket.tenant), attempt.key().as_str())
            .hset(
                REDIS_TICKET_OF,
                redis_ticket_field(attempt.scope(), attempt.key().as_str()),
                stored_outcome(&outcome),
            )
            .query_async(&mut conn)
            .await
            .map_err(db)?;
        // Not recorded: the layer completes the record after this answer.
        Ok(Created::Ticket {
            id,
            outcome,
            recorded: false,
        })
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(RedisTicketProbe(self.0.clone())))
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
            Ok(Some(text)) => {
                read_stored_outcome(&text).map_or(Finding::Unknown, Finding::Happened)
            }
            Ok(None) => Finding::NotHappened,
            Err(_) => Finding::Unknown,
        }
    }
}
