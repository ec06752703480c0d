//! A record as a row: reading (strictly, anything odd is `Corrupt`) and writing.

use idem_core::checkpoint::checkpoint_item;
use idem_core::machine::{self, CheckpointAnswer, CompleteAnswer};
use idem_core::record::{RawRecord, timestamp_to_column, to_column};
use idem_core::{
    Checkpoint, IdempotencyKey, Outcome, Policy, Record, RecordState, Scope, StoreError, Timestamp,
    Token,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::at;
use crate::schema::Sql;

/// A timestamp as an SQLite INTEGER, by the one rule of [`idem_core::record`].
pub(crate) fn ts_to_sql(t: Timestamp) -> i64 {
    timestamp_to_column(t)
}

/// The columns of a row, as SQLite typed them (a wrongly typed value fails here, as `Corrupt`).
fn read_row(row: &Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        scope: row.get(0)?,
        key: row.get(1)?,
        fingerprint: row.get(2)?,
        state: row.get(3)?,
        token_seq: row.get(4)?,
        token_id: row.get(5)?,
        attempt: row.get(6)?,
        lease_until: row.get(7)?,
        outcome_status: row.get(8)?,
        outcome_body: row.get(9)?,
        outcome_class: row.get(10)?,
        created_at: row.get(11)?,
        updated_at: row.get(12)?,
        expires_at: row.get(13)?,
        checkpoints: row.get(14)?,
    })
}

/// The record stored for (scope, key), expired or not.
pub(crate) fn read(
    conn: &Connection,
    sql: &Sql,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(&sql.select)
        .map_err(at("read: prepare"))?
        .query_row(params![scope.as_str(), key.as_str()], read_row)
        .optional()
        .map_err(at("read"))?
        .map(RawRecord::into_record)
        .transpose()
}

/// Every row a query returns, as records.
pub(crate) fn read_all(
    conn: &Connection,
    query: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Record>, StoreError> {
    let mut stmt = conn.prepare_cached(query).map_err(at("list: prepare"))?;
    let rows = stmt
        .query_map(params, read_row)
        .map_err(at("list"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(at("list"))?;
    rows.into_iter().map(RawRecord::into_record).collect()
}

/// The record's columns in the schema's order, as the insert and update statements bind them.
fn columns(r: &RawRecord) -> [&dyn rusqlite::ToSql; 15] {
    [
        &r.scope,
        &r.key,
        &r.fingerprint,
        &r.state,
        &r.token_seq,
        &r.token_id,
        &r.attempt,
        &r.lease_until,
        &r.outcome_status,
        &r.outcome_body,
        &r.outcome_class,
        &r.created_at,
        &r.updated_at,
        &r.expires_at,
        &r.checkpoints,
    ]
}

/// Writes `record` in place of `found`: an INSERT when there was no row, else an UPDATE fenced by
/// the token that was read. Must run inside the transaction that read `found`.
pub(crate) fn write(
    conn: &Connection,
    sql: &Sql,
    record: &Record,
    found: Option<&Record>,
) -> Result<(), StoreError> {
    let r = RawRecord::from_record(record);
    let columns = columns(&r);
    let changed = match found {
        None => conn
            .prepare_cached(&sql.insert)
            .map_err(at("write: prepare"))?
            .execute(columns.as_slice())
            .map_err(at("write: insert"))?,
        Some(old) => {
            let old_seq = idem_core::record::to_column(old.token.seq);
            let old_id = old.token.id_hex();
            let mut all: Vec<&dyn rusqlite::ToSql> = columns.to_vec();
            all.push(&old_seq);
            all.push(&old_id);
            conn.prepare_cached(&sql.update_held)
                .map_err(at("write: prepare"))?
                .execute(all.as_slice())
                .map_err(at("write: update"))?
        }
    };
    if changed != 1 {
        // Cannot happen under the write lock that read `found`; refuse rather than guess.
        return Err(StoreError::Backend {
            message: format!(
                "sqlite: the record changed under a write transaction ({changed} rows)"
            ),
            source: None,
        });
    }
    Ok(())
}

/// Inserts `record`, a claim of a key that was absent when read, unless a record for its key
/// exists by now: whether it was inserted. Must run inside a write transaction.
pub(crate) fn insert_new(
    conn: &Connection,
    sql: &Sql,
    record: &Record,
) -> Result<bool, StoreError> {
    let r = RawRecord::from_record(record);
    let inserted = conn
        .prepare_cached(&sql.insert_new)
        .map_err(at("claim: prepare"))?
        .execute(columns(&r).as_slice())
        .map_err(at("claim: insert"))?;
    Ok(inserted == 1)
}

/// [`machine::complete`] as one fenced `UPDATE` (a live `processing` record held by `token`
/// takes the outcome; anything else is `Fenced` and nothing is written), on `conn`: the store's
/// write transaction or the caller's (`complete_in`).
#[allow(clippy::too_many_arguments)] // the address, the token, the outcome under its policy, now
pub(crate) fn complete(
    conn: &Connection,
    sql: &Sql,
    scope: &Scope,
    key: &IdempotencyKey,
    token: Token,
    outcome: &Outcome,
    policy: &Policy,
    now: Timestamp,
) -> Result<CompleteAnswer, StoreError> {
    machine::check_outcome_size(outcome, policy)?;
    let state = machine::completed_state(outcome, policy);
    let updated = conn
        .prepare_cached(&sql.complete)
        .map_err(at("complete: prepare"))?
        .execute(params![
            scope.as_str(),
            key.as_str(),
            to_column(token.seq),
            token.id_hex(),
            ts_to_sql(now),
            state.as_str(),
            i64::from(outcome.status()),
            outcome.body(),
            outcome.class().as_str(),
            ts_to_sql(now + policy.ttl()),
        ])
        .map_err(at("complete"))?;
    Ok(match (updated, state) {
        (0, _) => CompleteAnswer::Fenced,
        (_, RecordState::Completed) => CompleteAnswer::Completed,
        _ => CompleteAnswer::MarkedRetryable,
    })
}

/// [`machine::checkpoint`] as one fenced `UPDATE` (a live `processing` record held by `token`
/// appends the checkpoint; anything else is `Fenced` and nothing is written).
pub(crate) fn checkpoint(
    conn: &Connection,
    sql: &Sql,
    scope: &Scope,
    key: &IdempotencyKey,
    token: Token,
    checkpoint: &Checkpoint,
) -> Result<CheckpointAnswer, StoreError> {
    let updated = conn
        .prepare_cached(&sql.checkpoint)
        .map_err(at("checkpoint: prepare"))?
        .execute(params![
            scope.as_str(),
            key.as_str(),
            to_column(token.seq),
            token.id_hex(),
            checkpoint_item(checkpoint),
            ts_to_sql(checkpoint.saved_at()),
        ])
        .map_err(at("checkpoint"))?;
    Ok(match updated {
        0 => CheckpointAnswer::Fenced,
        _ => CheckpointAnswer::Saved,
    })
}
