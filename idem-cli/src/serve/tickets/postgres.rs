//! Tickets in the PostgreSQL database, next to the records.

use idem_core::machine::CompleteAnswer;
use idem_core::reconcile::Probe;
use idem_core::{Attempt, StoreError};
use idemkit::postgres::{PostgresStore, sqlx};

use super::{BoxError, CREATE_TICKETS, Created, DOUBLE_EFFECTS, INSERT_TICKET, NewTicket, Tickets};

/// Tickets in the PostgreSQL database, inserted in the transaction that completes the record.
pub(super) struct PostgresTickets(pub(super) PostgresStore);

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
        Ok(insert(self.0.pool(), key, ticket).await?)
    }

    async fn create(&self, attempt: &Attempt, ticket: NewTicket) -> Result<Created, StoreError> {
        let key = attempt.key();
        let db = |e: sqlx::Error| StoreError::backend("postgres: tickets", e);
        let mut tx = self.0.pool().begin().await.map_err(db)?;
        let id = insert(&mut *tx, key.as_str(), &ticket).await.map_err(db)?;
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

/// Inserts `ticket` under `key` through `conn` (the pool or a transaction); returns its id.
async fn insert<'e>(
    conn: impl sqlx::PgExecutor<'e>,
    key: &str,
    ticket: &NewTicket,
) -> Result<i64, sqlx::Error> {
    let mut query = sqlx::query_scalar(INSERT_TICKET);
    for value in ticket.row(key) {
        query = query.bind(value);
    }
    query.fetch_one(conn).await
}
