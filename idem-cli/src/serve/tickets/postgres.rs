//! Tickets in the PostgreSQL database, next to the records.
//!
//! Every statement here is a simple query, or an unnamed one (`persistent(false)`) inside a
//! transaction, so it
//! works behind a transaction pooler too (`?pooler=transaction`): sqlx parses and binds an
//! unnamed statement in two round trips, which a pooler keeps on one server connection only
//! within a transaction, and a named one would outlive it.

use idem_core::machine::CompleteAnswer;
use idem_core::reconcile::Probe;
use idem_core::{Attempt, StoreError};
use idemkit::postgres::{PostgresStore, sqlx};

use super::{
    Answer, BoxError, CREATE_TICKETS, Created, DOUBLE_EFFECTS, INSERT_TICKET, NewTicket, Tickets,
};

/// Tickets in the PostgreSQL database, inserted in the transaction that completes the record.
pub(super) struct PostgresTickets(pub(super) PostgresStore);

#[idem_core::async_trait]
impl Tickets for PostgresTickets {
    async fn create_table(&self) -> Result<(), BoxError> {
        // A constant with a constant rewritten into it: no input reaches this text. A simple
        // query (no statement is prepared) of two statements, so one implicit transaction: the
        // lock serialises servers starting at once (concurrent `CREATE TABLE IF NOT EXISTS` of a
        // new table can fail on the catalog's unique index).
        let create =
            CREATE_TICKETS.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SELECT pg_advisory_xact_lock(7419002); {create}"
        )))
        .execute(self.0.pool())
        .await?;
        Ok(())
    }

    async fn count(&self, tenant: &str) -> Result<i64, BoxError> {
        self.count_of("SELECT COUNT(*) FROM tickets WHERE tenant = $1", tenant)
            .await
    }

    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        self.count_of(DOUBLE_EFFECTS, tenant).await
    }

    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError> {
        let mut tx = self.0.pool().begin().await?;
        let id = insert(&mut *tx, key, ticket).await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        answer: Answer,
    ) -> Result<Created, StoreError> {
        let key = attempt.key();
        let db = |e: sqlx::Error| StoreError::backend("postgres: tickets", e);
        let mut tx = self.0.pool().begin().await.map_err(db)?;
        let id = insert(&mut *tx, key.as_str(), &ticket).await.map_err(db)?;
        let outcome = answer(&ticket, id);
        match self.0.complete_in(&mut tx, attempt, &outcome).await? {
            CompleteAnswer::Fenced => {
                tx.rollback().await.map_err(db)?;
                Ok(Created::Fenced)
            }
            _ => {
                tx.commit().await.map_err(db)?;
                Ok(Created::Ticket {
                    id,
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

impl PostgresTickets {
    /// The count `sql` gives for `tenant` (`$1`), in a transaction of its own.
    async fn count_of(&self, sql: &'static str, tenant: &str) -> Result<i64, BoxError> {
        let mut tx = self.0.pool().begin().await?;
        let n = sqlx::query_scalar(sql)
            .bind(tenant)
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(n)
    }
}

/// Inserts `ticket` under `key` through `conn` (the pool or a transaction); returns its id.
async fn insert<'e>(
    conn: impl sqlx::PgExecutor<'e>,
    key: &str,
    ticket: &NewTicket,
) -> Result<i64, sqlx::Error> {
    let mut query = sqlx::query_scalar(INSERT_TICKET).persistent(false);
    for value in ticket.row(key) {
        query = query.bind(value);
    }
    query.fetch_one(conn).await
}
