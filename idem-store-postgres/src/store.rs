//! [`KeyStore`] for [`PostgresStore`]: each operation is one statement (a claim: a read, and an
//! insert or a compare-and-set when the rules write),
//! deciding with the rules of [`idem_core::machine`].

use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::{CheckpointStore, ListFilter};
use idem_core::wait::{Timer, changed, poll_every, poll_for_change};
use idem_core::{
    Checkpoint, Clock, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, RecordState,
    StoreError, Timestamp, Token, async_trait,
};

use crate::PostgresStore;
use crate::conflict::{MAX_CLAIM_ROUNDS, claim_error, conflict_backoff, retry_conflicts};
use crate::error::is_transient_conflict;
use crate::ops::Held;
use crate::row::{big, record_from_row, timestamp, ts};
use crate::schema::{self, trusted};
use crate::wake::SAFETY_POLL;

#[async_trait]
impl KeyStore for PostgresStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.ready().await;
        self.claim_alone(id, fingerprint, policy, now).await
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
        self.ready().await;
        if self.batching {
            return self.complete_batched(id, token, outcome, policy, now).await;
        }
        retry_conflicts(&self.mode, "complete", || {
            let held = Held { id, token };
            self.complete_on(&self.pool, held, outcome, policy, now)
        })
        .await
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.ready().await;
        let sql = &self.sql.release;
        Ok(
            if self.fenced_update("release", sql, id, token, now).await? {
                ReleaseAnswer::Released
            } else {
                ReleaseAnswer::Fenced
            },
        )
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        machine::check_lease(lease)?;
        self.ready().await;
        // One fenced UPDATE that keeps the later deadline and returns the one stored; run again
        // on a serialization failure or deadlock, as every write is.
        let row = retry_conflicts(&self.mode, "extend", || {
            self.statement(&self.sql.extend)
                .bind(id.scope().as_str())
                .bind(id.key().as_str())
                .bind(big(token.seq))
                .bind(token.id_hex())
                .bind(ts(now))
                .bind(ts(now + lease))
                .fetch_optional(&self.pool)
        })
        .await?;
        Ok(match row {
            Some(row) => ExtendAnswer::Extended {
                lease_until: timestamp(&row, "lease_until")?,
            },
            None => ExtendAnswer::Fenced,
        })
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.ready().await;
        let row = retry_conflicts(&self.mode, "get", || {
            self.statement(&self.sql.get)
                .bind(id.scope().as_str())
                .bind(id.key().as_str())
                .bind(ts(now))
                .fetch_optional(&self.pool)
        })
        .await?;
        row.as_ref().map(record_from_row).transpose()
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.ready().await;
        let rows = retry_conflicts(&self.mode, "list_in_flight", || {
            self.statement(&self.sql.list_in_flight)
                .bind(ts(older_than))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
        })
        .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.ready().await;
        // Only the filters that are set, so each is served by an index: a state filter reads
        // `(state, updated_at)` in order, a scope filter (without a state) the primary key.
        // With neither, the query reads `(state, updated_at)` once per state, at most `limit`
        // rows each, and merges them (a Merge Append): the order one `(updated_at)` index would
        // give, without the write cost of that index on every claim and completion.
        let mut conditions = String::from("expires_at > $1");
        let mut n = 1;
        for (set, column) in [
            (filter.state.is_some(), "state = "),
            (filter.scope.is_some(), "scope = "),
            (filter.updated_before.is_some(), "updated_at <= "),
        ] {
            if set {
                n += 1;
                conditions.push_str(&format!(" AND {column}${n}"));
            }
        }
        let order = format!("ORDER BY updated_at, scope, key LIMIT ${}", n + 1);
        let (columns, table) = (schema::COLUMNS, &self.sql.qualified);
        let sql = if filter.state.is_some() || filter.scope.is_some() {
            format!("SELECT {columns} FROM {table} WHERE {conditions} {order}")
        } else {
            let per_state: Vec<String> = RecordState::ALL
                .iter()
            .map(|state| {
                format!(
                    "(SELECT {columns} FROM {table} WHERE state = '{}' AND {conditions} {order})",
                    state.as_str()
                )
            })
            .collect();
            format!(
                "SELECT {columns} FROM ({}) AS per_state {order}",
                per_state.join(" UNION ALL ")
            )
        };
        let sql = trusted(sql);
        let rows = retry_conflicts(&self.mode, "list", || {
            let mut query = self.statement(&sql).bind(ts(now));
            if let Some(state) = filter.state {
                query = query.bind(state.as_str());
            }
            if let Some(scope) = &filter.scope {
                query = query.bind(scope.as_str());
            }
            if let Some(before) = filter.updated_before {
                query = query.bind(ts(before));
            }
            query
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
        })
        .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        self.ready().await;
        let deleted = retry_conflicts(&self.mode, "purge_expired", || {
            self.statement(&self.sql.purge)
                .bind(ts(now))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.pool)
        })
        .await?
        .rows_affected();
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        // Register, read, then the first of a notification and a poll (every `SAFETY_POLL` while
        // the listener is up, the portable backoff while it is down): `crate::wake`.
        self.ready().await;
        let id = seen.id();
        // Behind a transaction pooler `LISTEN` succeeds but hears nothing (the session it ran in
        // is handed to other clients): without a direct connection to listen on, waits poll.
        let options = match (&self.listen, self.notifications, self.mode.inline()) {
            (Some(direct), true, _) => direct.clone(),
            (None, true, false) => self.pool.connect_options(),
            _ => return poll_for_change(self, seen, clock, timer).await,
        };
        self.hub.start(&options).await;
        let (mut registered, up) = self.hub.register(self.payload(&id));
        if up {
            self.mark_waited(&id).await?;
        }
        if changed(seen, self.get(&id, clock.now()).await?.as_ref()) {
            return Ok(());
        }
        if up {
            tokio::select! {
                () = registered.woken() => Ok(()),
                polled = poll_every(self, seen, clock, timer, SAFETY_POLL) => polled,
            }
        } else {
            tokio::select! {
                () = registered.woken() => Ok(()),
                polled = poll_for_change(self, seen, clock, timer) => polled,
            }
        }
    }
}

impl PostgresStore {
    /// A claim on its own: rounds of [`PostgresStore::claim_round`] until one decides.
    pub(crate) async fn claim_alone(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let req = ClaimRequest::new(id, fingerprint);
        for round in 1..=MAX_CLAIM_ROUNDS {
            let inline = self.mode.inline();
            match self.claim_round(id, req, policy, now).await {
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => continue,
                // That statement did not run, and the round's statements before it wrote nothing
                // (a round returns at its first write): the next round starts afresh, inline.
                Err(e) if self.mode.collided(inline, &e) => continue,
                Err(e) if is_transient_conflict(&e) => conflict_backoff(round).await,
                Err(e) => return Err(claim_error(e)),
            }
        }
        tracing::warn!(scope = %id.scope(), key = %id.key(), "claim gave up: the record kept changing");
        Err(StoreError::Unavailable {
            message: format!(
                "postgres claim: the record changed {MAX_CLAIM_ROUNDS} times while claiming; try again"
            ),
            source: None,
        })
    }
}

#[async_trait]
impl CheckpointStore for PostgresStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        self.ready().await;
        let item = idem_core::store::columns::checkpoint_item(checkpoint);
        let updated = retry_conflicts(&self.mode, "checkpoint", || {
            self.statement(&self.sql.checkpoint)
                .bind(id.scope().as_str())
                .bind(id.key().as_str())
                .bind(big(token.seq))
                .bind(token.id_hex())
                .bind(ts(checkpoint.saved_at()))
                .bind(item.as_str())
                .execute(&self.pool)
        })
        .await?
        .rows_affected();
        Ok(match updated {
            0 => CheckpointAnswer::Fenced,
            _ => CheckpointAnswer::Saved,
        })
    }
}
