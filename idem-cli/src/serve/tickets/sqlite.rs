//! Tickets in the SQLite file, next to the records.

use idem_core::machine::CompleteAnswer;
use idem_core::reconcile::Probe;
use idem_core::{Attempt, StoreError};
use idemkit::sqlite::SqliteStore;
use idemkit::sqlite::rusqlite::{self, TransactionBehavior};

use super::{
    Answer, BoxError, CREATE_TICKETS, Created, DOUBLE_EFFECTS, INSERT_TICKET, NewTicket, Tickets,
};

/// Tickets in the SQLite file, inserted in the transaction that completes the record.
pub(super) struct SqliteTickets(pub(super) SqliteStore);

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
        let (key, ticket) = (key.to_owned(), ticket.clone());
        Ok(self
            .0
            .with_connection(move |c| insert(c, &key, &ticket))
            .await??)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        answer: Answer,
    ) -> Result<Created, StoreError> {
        let (key, attempt) = (attempt.key().clone(), attempt.clone());
        let store = self.0.clone();
        self.0
            .with_connection(move |conn| {
                let db = |e: rusqlite::Error| StoreError::backend("sqlite: tickets", e);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(db)?;
                let id = insert(&tx, key.as_str(), &ticket).map_err(db)?;
                let outcome = answer(&ticket, id);
                match store.complete_in(&tx, &attempt, &outcome)? {
                    CompleteAnswer::Fenced => Ok(Created::Fenced), // dropped: rolled back
                    _ => {
                        tx.commit().map_err(db)?;
                        Ok(Created::Ticket {
                            id,
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

/// Inserts `ticket` under `key` on `conn` (a transaction derefs to one); returns its id.
fn insert(conn: &rusqlite::Connection, key: &str, ticket: &NewTicket) -> rusqlite::Result<i64> {
    conn.query_row(&INSERT_TICKET.replace('$', "?"), ticket.row(key), |r| {
        r.get(0)
    })
}
