//! The statements the store runs on a connection: reading records, and writing them (a claim's
//! insert, the write a rule decided, the fenced completion and checkpoint).

use idem_core::machine::{self, CheckpointAnswer, CompleteAnswer};
use idem_core::store::columns::RawRecord;
use idem_core::store::columns::checkpoint_item;
use idem_core::{
    Checkpoint, Outcome, Policy, Record, RecordId, RecordState, StoreError, Timestamp, Token,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::at;
use crate::row::{big, columns, read_row, ts};
use crate::schema::Statements;

/// The record `id`, expired or not.
pub(crate) fn read(
    conn: &Connection,
    sql: &Statements,
    id: &RecordId,
) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(&sql.select_any)
        .map_err(at("read: prepare"))?
        .query_row(params![id.scope().as_str(), id.key().as_str()], read_row)
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

/// Writes `record` in place of `found`: an INSERT when there was no row, else an UPDATE fenced by
/// the token that was read. Must run inside the transaction that read `found`.
pub(crate) fn write(
    conn: &Connection,
    sql: &Statements,
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
            let old_seq = big(old.token.seq);
            let old_id = old.token.id_hex();
            let mut all: Vec<&dyn rusqlite::ToSql> = columns.to_vec();
            all.push(&old_seq);
            all.push(&old_id);
            conn.prepare_cached(&sql.replace)
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
    sql: &Statements,
    record: &Record,
) -> Result<bool, StoreError> {
    let r = RawRecord::from_record(record);
    let inserted = conn
        .prepare_cached(&sql.insert)
        .map_err(at("claim: prepare"))?
        .execute(columns(&r).as_slice())
        .map_err(at("claim: insert"))?;
    Ok(inserted == 1)
}

/// The claim a fenced write is made under: the record's address and the holder's token.
#[derive(Clone, Copy)]
pub(crate) struct Held<'a> {
    pub(crate) id: &'a RecordId,
    pub(crate) token: Token,
}

/// [`machine::complete`] as one fenced `UPDATE` (a live `processing` record held by `token`
/// takes the outcome; anything else is `Fenced` and nothing is written), on `conn`: the store's
/// write transaction or the caller's (`complete_in`).
pub(crate) fn complete_on(
    conn: &Connection,
    sql: &Statements,
    held: Held<'_>,
    outcome: &Outcome,
    policy: &Policy,
    now: Timestamp,
) -> Result<CompleteAnswer, StoreError> {
    let Held { id, token } = held;
    machine::check_outcome_size(outcome, policy)?;
    let state = machine::completed_state(outcome, policy);
    let updated = conn
        .prepare_cached(&sql.complete)
        .map_err(at("complete: prepare"))?
        .execute(params![
            id.scope().as_str(),
            id.key().as_str(),
            big(token.seq),
            token.id_hex(),
            ts(now),
            state.as_str(),
            i64::from(outcome.status()),
            outcome.body(),
            outcome.class().as_str(),
            ts(now + policy.ttl()),
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
    sql: &Statements,
    held: Held<'_>,
    checkpoint: &Checkpoint,
) -> Result<CheckpointAnswer, StoreError> {
    let Held { id, token } = held;
    let updated = conn
        .prepare_cached(&sql.checkpoint)
        .map_err(at("checkpoint: prepare"))?
        .execute(params![
            id.scope().as_str(),
            id.key().as_str(),
            big(token.seq),
            token.id_hex(),
            checkpoint_item(checkpoint),
            ts(checkpoint.saved_at()),
        ])
        .map_err(at("checkpoint"))?;
    Ok(match updated {
        0 => CheckpointAnswer::Fenced,
        _ => CheckpointAnswer::Saved,
    })
}
