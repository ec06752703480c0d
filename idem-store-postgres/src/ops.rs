//! The statements behind each operation: a claim's rounds, a fenced update, a completion on any
//! executor (the pool, or the caller's transaction).

use idem_core::machine::{self, ClaimAnswer, ClaimRequest, CompleteAnswer};
use idem_core::{
    Attempt, Outcome, Policy, Record, RecordId, RecordState, StoreError, Timestamp, Token,
};
use sqlx::{PgConnection, Postgres, Row, SqlStr};

use crate::PostgresStore;
use crate::conflict::retry_conflicts;
use crate::error::classify;
use crate::row::{big, bind_record, record_from_row, ts};

/// The claim a fenced write is made under: the record's address and the holder's token.
#[derive(Clone, Copy)]
pub(crate) struct Held<'a> {
    pub(crate) id: &'a RecordId,
    pub(crate) token: Token,
}

impl PostgresStore {
    /// Completes `attempt`'s claim with `outcome` on the caller's connection, typically `&mut tx`
    /// of an open [`sqlx::Transaction`], so the operation's own writes and the completed record
    /// commit (or roll back) together. Runs [`KeyStore::complete`](idem_core::KeyStore::complete)'s
    /// fenced `UPDATE` under the attempt's policy and at its clock's now. Pass the outcome through
    /// [`Attempt::encode`] first if the executor has a codec.
    ///
    /// The answer describes the transaction's view: `Completed` is only durable once the caller
    /// commits. The statement's `NOTIFY` is part of the transaction too: requests waiting on the
    /// record, in this process and in others, wake when it commits, never if it rolls back. Once
    /// it has committed, call [`Attempt::mark_recorded`], so the executor does not complete the
    /// record again; if the transaction rolls back, the record stays `processing`
    /// with the same token and the executor records the operation's own outcome as usual. If the
    /// answer is [`CompleteAnswer::Fenced`], roll back: the effect must not happen either.
    ///
    /// Unlike [`KeyStore::complete`](idem_core::KeyStore::complete), this cannot run the statement
    /// again after a serialization failure or deadlock (the caller's transaction is aborted): it
    /// answers [`StoreError::Unavailable`], and the caller retries its whole transaction.
    ///
    /// ```no_run
    /// # use idem_store_postgres::PostgresStore;
    /// # use idem_core::{Attempt, Outcome};
    /// # use idem_core::machine::CompleteAnswer;
    /// # async fn demo(store: &PostgresStore, attempt: &Attempt)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO tickets (title) VALUES ($1)").bind("printer on fire")
    ///     .execute(&mut *tx).await?;
    /// let outcome = Outcome::definitive(201, &serde_json::json!({"ticket": 1}))?;
    /// match store.complete_in(&mut tx, attempt, &attempt.encode(&outcome)?).await? {
    ///     CompleteAnswer::Fenced => tx.rollback().await?, // lost the claim: undo the effect
    ///     _ => {
    ///         tx.commit().await?;
    ///         attempt.mark_recorded(); // the executor must not complete it again
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        attempt: &Attempt,
        outcome: &Outcome,
    ) -> Result<CompleteAnswer, StoreError> {
        let policy = attempt.policy();
        machine::check_outcome_size(outcome, policy)?;
        self.ready().await;
        let held = Held {
            id: attempt.id(),
            token: attempt.token(),
        };
        let inline = self.mode.inline();
        self.complete_on(conn, held, outcome, policy, attempt.now())
            .await
            .map_err(|e| {
                // The caller's transaction is aborted: it runs again, and this statement inline.
                if self.mode.collided(inline, &e) {
                    return StoreError::unavailable(
                        "postgres complete: a transaction pooler is in the path and a prepared \
                         statement collided; statements are sent inline from now on: retry the \
                         transaction",
                        e,
                    );
                }
                classify("complete", e)
            })
    }

    /// [`machine::complete`] as one fenced `UPDATE` (a live `processing` record held by `token`
    /// takes the outcome; anything else is `Fenced` and nothing is written), on `executor`: the
    /// pool or the caller's transaction (`complete_in`).
    pub(crate) async fn complete_on<'e, E>(
        &self,
        executor: E,
        held: Held<'_>,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, sqlx::Error>
    where
        E: sqlx::Executor<'e, Database = Postgres>,
    {
        let Held { id, token } = held;
        let state = machine::completed_state(outcome, policy);
        let updated = self
            .statement(&self.sql.complete)
            .bind(id.scope().as_str())
            .bind(id.key().as_str())
            .bind(big(token.seq))
            .bind(token.id_hex())
            .bind(ts(now))
            .bind(state.as_str())
            .bind(i32::from(outcome.status()))
            .bind(outcome.body())
            .bind(outcome.class().as_str())
            .bind(ts(now + policy.ttl()))
            .bind(self.payload(id))
            .execute(executor)
            .await?
            .rows_affected();
        Ok(match (updated, state) {
            (0, _) => CompleteAnswer::Fenced,
            (_, RecordState::Completed) => CompleteAnswer::Completed,
            _ => CompleteAnswer::MarkedRetryable,
        })
    }

    /// What a write of `id` notifies its waiters with ([`crate::wake`]).
    pub(crate) fn payload(&self, id: &RecordId) -> String {
        crate::wake::payload(&self.sql.qualified, id)
    }

    /// The record `id`, expired or not, with its checkpoints column as stored
    /// (what the claim's compare-and-set compares).
    pub(crate) async fn read(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
    ) -> Result<Option<(Record, Option<String>)>, sqlx::Error> {
        let row = self
            .statement(&self.sql.select_any)
            .bind(id.scope().as_str())
            .bind(id.key().as_str())
            .fetch_optional(conn)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let record = record_from_row(&row).map_err(|e| sqlx::Error::Decode(e.into()))?;
        let checkpoints = row.try_get("checkpoints")?;
        Ok(Some((record, checkpoints)))
    }

    /// One round of a claim: `Ok(Some(answer))` when decided, `Ok(None)` when the record changed
    /// under us and the round must be run again.
    pub(crate) async fn claim_round(
        &self,
        id: &RecordId,
        req: ClaimRequest<'_>,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<Option<ClaimAnswer>, sqlx::Error> {
        // Under load (claims' inserts queued, or a batch of them running), insert first: the
        // record a new key gets goes into the next batch without a read before it, so a first
        // execution costs its share of one statement and one commit. A key that exists comes
        // back not inserted and is read below, as after a lost race.
        if self.batching && self.inserts_busy() {
            let fresh = machine::claim(None, req, now, policy);
            if let Some(record) = &fresh.write
                && self.insert_in_lane(record).await?
            {
                return Ok(Some(fresh.answer));
            }
        }
        // The round's statements share one pooled connection: one wait for the pool, as a
        // single statement would have (each statement still commits on its own).
        let mut conn = self.pool.acquire().await?;
        // Read first: a replay (and an in-flight or mismatched request) is this one read.
        let (found, checkpoints) = match self.read(&mut conn, id).await? {
            Some(found) => found,
            None => {
                let fresh = machine::claim(None, req, now, policy);
                let Some(record) = &fresh.write else {
                    return Ok(Some(fresh.answer));
                };
                // Batching: alone (nothing queued, a turn free), the unbatched insert below on
                // this connection, holding the turn; else with the inserts of claims arriving
                // together (`crate::batch`), on the batch's connection.
                let alone = self.batching.then(|| self.lone_insert_turn());
                if let Some(None) = alone {
                    // Ours goes back to the pool meanwhile, or claims holding every connection
                    // would wait for a batch that cannot get one.
                    drop(conn);
                    if self.insert_in_lane(record).await? {
                        return Ok(Some(fresh.answer));
                    }
                    conn = self.pool.acquire().await?;
                } else {
                    let inserted = bind_record(self.statement(&self.sql.insert), record)
                        .execute(&mut *conn)
                        .await?
                        .rows_affected();
                    drop(alone);
                    if inserted == 1 {
                        return Ok(Some(fresh.answer));
                    }
                }
                // A concurrent claim inserted the key since our read (the insert waited for it
                // to commit). A new statement takes a new snapshot and sees its row
                // (idem_core::contract §7).
                match self.read(&mut conn, id).await? {
                    Some(found) => found,
                    None => return Ok(None), // purged meanwhile: start again
                }
            }
        };
        let decided = machine::claim(Some(&found), req, now, policy);
        let Some(write) = decided.write else {
            return Ok(Some(decided.answer)); // replay, in flight, mismatch: nothing written
        };
        // Replacing a `processing` record (a takeover, an expired record) wakes its waiters.
        let notify = found.state == RecordState::Processing;
        let sql = if notify {
            &self.sql.replace_notify
        } else {
            &self.sql.replace
        };
        let mut replace = bind_record(self.statement(sql), &write)
            .bind(big(found.token.seq))
            .bind(found.token.id_hex())
            .bind(found.state.as_str())
            .bind(ts(found.lease_until))
            .bind(ts(found.expires_at))
            .bind(checkpoints);
        if notify {
            replace = replace.bind(self.payload(id));
        }
        let replaced = replace.execute(&mut *conn).await?.rows_affected();
        Ok((replaced == 1).then_some(decided.answer))
    }

    /// [`Self::insert_batched`] inside a claim's round, whose errors are `sqlx::Error`s: a
    /// `StoreError` travels as a decode error, which `claim_error` unwraps.
    async fn insert_in_lane(&self, record: &Record) -> Result<bool, sqlx::Error> {
        let inserted = self.insert_batched(record).await;
        inserted.map_err(|e| sqlx::Error::Decode(e.into()))
    }

    /// Marks `id` as waited on, so that its next writes notify ([`crate::wake`]).
    pub(crate) async fn mark_waited(&self, id: &RecordId) -> Result<(), StoreError> {
        retry_conflicts(&self.mode, "mark waited", || {
            self.statement(&self.sql.mark_waited)
                .bind(id.scope().as_str())
                .bind(id.key().as_str())
                .execute(&self.pool)
        })
        .await?;
        Ok(())
    }

    /// A fenced update that notifies the record's waiters (`$6`, the wake-up payload).
    pub(crate) async fn fenced_update(
        &self,
        op: &'static str,
        sql: &SqlStr,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let payload = self.payload(id);
        let updated = retry_conflicts(&self.mode, op, || {
            self.statement(sql)
                .bind(id.scope().as_str())
                .bind(id.key().as_str())
                .bind(big(token.seq))
                .bind(token.id_hex())
                .bind(ts(now))
                .bind(payload.as_str())
                .execute(&self.pool)
        })
        .await?
        .rows_affected();
        Ok(updated == 1)
    }
}
