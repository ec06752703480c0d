//! [`KeyStore`] for [`SqliteStore`]: each operation reads the record, decides with the rules of
//! [`idem_core::machine`] and writes, in one transaction.

use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::{CheckpointStore, ListFilter};
use idem_core::{
    Checkpoint, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, StoreError, Timestamp,
    Token, async_trait,
};
use rusqlite::params;

use crate::error::at;
use crate::pool::Inner;
use crate::{SqliteStore, ops, row};

#[async_trait]
impl KeyStore for SqliteStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let (id, fingerprint, policy) = (id.clone(), fingerprint.clone(), *policy);
        let first = self
            .run(move |inner, conn| {
                let req = ClaimRequest::new(&id, &fingerprint);
                // Read-only answers (replay, in flight, mismatch) are decided from one SELECT,
                // which sees one committed state: no write lock, so replays do not queue behind
                // writers.
                let found = ops::read(conn, &inner.sql, &id)?;
                let first = machine::claim(found.as_ref(), req, now, &policy);
                if first.write.is_none() {
                    return Ok(Ok(first.answer));
                }
                // A claim that writes goes on here if the write lock is free; otherwise it gives
                // the connection back (and its arguments, uncloned) and waits for its turn below,
                // holding none.
                let Some(turn) = inner.try_write_turn() else {
                    return Ok(Err((id, fingerprint)));
                };
                let answer = inner.write_tx(conn, &turn, |tx| {
                    // A key that was absent is inserted unless a record appeared meanwhile (one
                    // statement, no second read); any other record is read again and decided on.
                    if let (None, Some(record)) = (&found, &first.write)
                        && ops::insert_new(tx, &inner.sql, record)?
                    {
                        return Ok(first.answer);
                    }
                    inner.apply(tx, &id, |found| {
                        Ok(machine::claim(found, req, now, &policy))
                    })
                })?;
                claimed(inner, &id, &answer);
                Ok(Ok(answer))
            })
            .await?;
        let (id, fingerprint) = match first {
            Ok(answer) => return Ok(answer),
            Err(queued) => queued,
        };
        let notify = id.clone();
        let answer = self
            .run_batched(move |inner, tx| {
                let req = ClaimRequest::new(&id, &fingerprint);
                inner.apply(tx, &id, |found| {
                    Ok(machine::claim(found, req, now, &policy))
                })
            })
            .await?;
        claimed(&self.inner, &notify, &answer);
        Ok(answer)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        let (owned, outcome, policy) = (id.clone(), outcome.clone(), *policy);
        let answer = self
            .run_batched(move |inner, tx| {
                let held = ops::Held { id: &owned, token };
                ops::complete_on(tx, &inner.sql, held, &outcome, &policy, now)
            })
            .await?;
        self.inner.waiters.wake(id);
        Ok(answer)
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let owned = id.clone();
        let answer = self
            .run_batched(move |inner, tx| {
                inner.apply(tx, &owned, |found| Ok(machine::release(found, token, now)))
            })
            .await?;
        self.inner.waiters.wake(id);
        Ok(answer)
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        // Refused before any transaction is opened.
        machine::check_lease(lease)?;
        let id = id.clone();
        self.run_batched(move |inner, tx| {
            inner.apply(tx, &id, |found| {
                Ok(machine::extend(found, token, lease, now)?)
            })
        })
        .await
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        let id = id.clone();
        self.run(move |inner, conn| {
            Ok(ops::read(conn, &inner.sql, &id)?.filter(|r| !r.is_expired(now)))
        })
        .await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |inner, conn| {
            ops::read_all(
                conn,
                &inner.sql.list_in_flight,
                params![row::ts(older_than), limit],
            )
        })
        .await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let filter = filter.clone();
        self.run(move |inner, conn| {
            let (sql, params) = inner.sql.list(&filter, now, limit);
            ops::read_all(conn, &sql, rusqlite::params_from_iter(params))
        })
        .await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run_write(move |inner, conn, _turn| {
            conn.prepare_cached(&inner.sql.purge)
                .map_err(at("purge: prepare"))?
                .execute(params![row::ts(now), limit])
                .map_err(at("purge"))
        })
        .await
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn idem_core::Clock,
        timer: &idem_core::Timer,
    ) -> Result<(), StoreError> {
        crate::wake::wait_for_change(self, seen, clock, timer).await
    }
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        let (id, checkpoint) = (id.clone(), checkpoint.clone());
        self.run_batched(move |inner, tx| {
            let held = ops::Held { id: &id, token };
            ops::checkpoint(tx, &inner.sql, held, &checkpoint)
        })
        .await
    }
}

/// A claim that won rewrote the record (a retry, a takeover): its waiters look again.
fn claimed(inner: &Inner, id: &RecordId, answer: &ClaimAnswer) {
    if matches!(answer, ClaimAnswer::Claimed { .. }) {
        inner.waiters.wake(id);
    }
}
